"""``osmosis_ai.testing.HistorySource``: a previewable source over an appended list."""

from __future__ import annotations

from osmosis_ai.testing import HistorySource


async def test_sample_and_preview_are_isolated_copies() -> None:
    source = HistorySource([{"role": "user", "content": "q"}])
    source.messages.append({"role": "assistant", "content": "a"})
    sample = await source.get_sample()
    preview = await source.get_preview(1)
    assert preview is not None and preview.messages == [{"role": "assistant", "content": "a"}]
    assert preview.trajectory_messages == preview.messages
    preview.messages[0]["content"] = "changed"
    sample.messages[0]["content"] = "changed"
    assert [m["content"] for m in source.messages] == ["q", "a"]
    assert await source.get_preview(0) is None
    assert source.preview_calls == 2


def test_revision_follows_the_length_unless_turned_off() -> None:
    source = HistorySource()
    assert source.preview_revision() == 0
    source.messages.append({"role": "user", "content": "x"})
    assert source.preview_revision() == 1
    assert HistorySource(revision=False).preview_revision() is None
