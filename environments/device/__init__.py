"""The built-in ``device`` environment: a ToolSandbox-style phone (settings, contacts, messages, reminders, clock)."""
