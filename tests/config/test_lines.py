"""The line scanner that places config errors (``osmosis_ai.config.lines``)."""

from __future__ import annotations

import textwrap

from osmosis_ai.config.lines import key_lines


def test_key_lines_step_over_multiline_values_and_comments():
    text = textwrap.dedent(
        '''\
        # [fake] header in a comment
        [experiment]
        note = """
        [not_a_table]
        fake = 1
        """
        list = [
          "a = b",
          [1, 2],
        ]
        "quoted.key" = 1
        [ evaluation ]
        n = 1 # trailing
        [[runs]]
        a.b = 2
        '''
    )
    lines = key_lines(text)
    assert lines[("experiment",)] == 2
    assert lines[("experiment", "note")] == 3
    assert lines[("experiment", "list")] == 7
    assert lines[("experiment", "quoted.key")] == 11
    assert lines[("evaluation",)] == 12
    assert lines[("evaluation", "n")] == 13
    assert lines[("runs", "a")] == 15
    assert lines[("runs", "a", "b")] == 15
    assert ("not_a_table",) not in lines
    assert ("fake",) not in lines
    assert ("experiment", "fake") not in lines
