"""The words scenarios are made of: names, relationships, message texts, reminder tasks, setting names."""

FIRST_NAMES = (
    "Alex",
    "Priya",
    "Marcus",
    "Sofia",
    "Daniel",
    "Mei",
    "Omar",
    "Hannah",
    "Lucas",
    "Aisha",
    "Ethan",
    "Chloe",
    "Mateo",
    "Grace",
    "Noah",
    "Yuki",
    "Samuel",
    "Leila",
    "Victor",
    "Nora",
    "Isaac",
    "Elena",
    "Tomas",
    "Ruby",
    "Jamal",
    "Ingrid",
    "Felix",
    "Zara",
    "Hugo",
    "Maya",
)
LAST_NAMES = (
    "Kim",
    "Rivera",
    "Patel",
    "Nguyen",
    "Okafor",
    "Schmidt",
    "Rossi",
    "Tanaka",
    "Cohen",
    "Silva",
    "Murphy",
    "Haddad",
    "Larsen",
    "Moreau",
    "Novak",
    "Brooks",
    "Chen",
    "Alvarez",
    "Singh",
    "Walsh",
)
AREA_CODES = ("415", "212", "617", "312", "206", "512", "303", "646", "919", "503")

# Relationships many contacts may share, and ones the user names as "my <relationship>" (unique per scenario).
COMMON_RELATIONSHIPS = ("friend", "coworker", "neighbor", "cousin", "classmate")
CLOSE_RELATIONSHIPS = ("sister", "brother", "mother", "father", "boss", "partner", "roommate")

# Messages already on the phone: (text, a word that identifies it).
CHAT_MESSAGES = (
    ("Can you pick up milk on your way home?", "milk"),
    ("The plumber is coming on Thursday morning.", "plumber"),
    ("Happy birthday! Hope you have a great day.", "birthday"),
    ("Don't forget the concert tickets.", "concert"),
    ("Are we still on for tennis this weekend?", "tennis"),
    ("I left my umbrella in your car.", "umbrella"),
    ("The package arrived, it's on the porch.", "package"),
    ("Let's try the new ramen place.", "ramen"),
    ("My flight lands at 6, can you pick me up?", "flight"),
    ("Thanks for the book recommendation!", "recommendation"),
    ("The wifi password is on the fridge.", "password"),
    ("Movie night at my place on Friday?", "movie"),
    ("I fixed the bike, it's ready.", "bike"),
    ("Can you send me the photos from the trip?", "photos"),
    ("The landlord replied about the heater.", "landlord"),
    ("See you at the gym at 7.", "gym"),
)

# Texts only the structured-data template puts on the phone: (text, a word that identifies it).
# No word occurs in another text here or in a name; "car" also occurs in the umbrella text above.
TEMPLATE_CHAT_MESSAGES = (
    ("The car is booked for Saturday.", "car"),
    ("Grandma wants a call this evening.", "grandma"),
    ("I found your keys under the sofa.", "keys"),
    ("The museum is free on Sundays.", "museum"),
    ("Your jacket is at the cleaners.", "jacket"),
    ("The soup recipe is in my notebook.", "soup"),
    ("Bring sunscreen for the beach.", "sunscreen"),
    ("The printer is out of ink again.", "printer"),
    ("We won the quiz last night!", "quiz"),
    ("The train was cancelled, taking the bus.", "train"),
    ("Remember to water the garden tomorrow.", "garden"),
    ("The puppy chewed my slippers.", "puppy"),
    ("Pizza or tacos for lunch?", "pizza"),
    ("The hotel confirmed our booking.", "hotel"),
)

# Messages the user asks to send: (request wording, message text, words it must contain, fillers for {x}).
OUTGOING_MESSAGES = (
    (
        "that I'm running {x} minutes late",
        "I'm running {x} minutes late.",
        ("{x}", "late"),
        ("5", "10", "15", "20", "25"),
    ),
    (
        "that the meeting moved to {x}",
        "The meeting moved to {x}.",
        ("meeting", "{x}"),
        ("2pm", "3pm", "4pm", "10am", "11am"),
    ),
    (
        "that I'll bring the {x}",
        "I'll bring the {x}.",
        ("bring", "{x}"),
        ("snacks", "cake", "charger", "salad", "board games"),
    ),
    ("that dinner is at {x} tonight", "Dinner is at {x} tonight.", ("dinner", "{x}"), ("6:30", "7:15", "7:30", "8:00")),
    (
        "asking them to call me back at {x}",
        "Can you call me back at {x}?",
        ("call", "{x}"),
        ("noon", "5pm", "6pm", "9am"),
    ),
    (
        "that I got the tickets for {x}",
        "I got the tickets for {x}!",
        ("tickets", "{x}"),
        ("Friday", "Saturday", "Sunday"),
    ),
)

# Reminder tasks: (what to do, the word a reminder about it must contain).
TASKS = (
    ("call the dentist", "dentist"),
    ("pay the electricity bill", "electricity"),
    ("water the plants", "plants"),
    ("pick up the dry cleaning", "dry cleaning"),
    ("renew my passport", "passport"),
    ("submit the expense report", "expense"),
    ("buy a birthday gift for Sam", "gift"),
    ("take out the trash", "trash"),
    ("feed the cat", "cat"),
    ("return the library books", "library"),
    ("book a haircut", "haircut"),
    ("check the oven timer", "oven"),
)

# How people name each setting.
SETTING_NAMES = {
    "wifi": ("wifi", "Wi-Fi"),
    "cellular_service": ("cellular service", "mobile data"),
    "low_battery_mode": ("low battery mode", "low power mode"),
    "location_service": ("location services", "location"),
}
