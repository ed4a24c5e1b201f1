from trace_ray import console as console_module
from trace_ray.console import print_table


def test_a_message_wider_than_the_console_stays_one_line_and_a_table_keeps_to_the_width(monkeypatch, capsys):
    monkeypatch.setattr(console_module.console, "width", 40)
    message = "trace-ray train skips switching (OUT_OF_BAND) unless synthesis.accept_out_of_band=true"
    console_module.console.print(message)
    print_table("t", ["name", "detail"], [["a", "a long cell that has to wrap inside a table forty columns wide"]])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == message
    assert all(len(line) <= 40 for line in lines[1:]) and len(lines) > 6
