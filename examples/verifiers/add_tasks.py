"""A verifiers (v1) taskset: add two numbers with the ``add`` tool, then say the sum.
Multi-turn: the model calls the tool, reads its result, answers. Rewarded for the right sum
(1) and for using the tool (0.5); a metric counts the tool calls.

The config names it by its module, ``add_tasks`` (the workspace leads the import path of the
Python that serves it; a taskset you installed is named the same way). verifiers starts the
tool's server as ``python -m add_tasks``: hence the ``__main__`` block.
"""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf

PAIRS = [(40, 2), (7, 5), (13, 8), (21, 21), (3, 9), (100, 1), (6, 6), (11, 30), (25, 17)]
PAIRS += [(a, b) for a in range(2, 12) for b in range(3, 9)]


class AddTools(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers and return the sum."""
        return a + b


class AddData(vf.TaskData):
    answer: str


class AddTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class AddTask(vf.Task[AddData, vf.State, AddTaskConfig]):
    @classmethod
    def toolsets(cls, config: AddTaskConfig) -> list[vf.Toolset]:
        return [AddTools(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.reward(weight=0.5)
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages) > 0)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(sum(len(m.tool_calls or []) for m in trace.assistant_messages))


class AddConfig(vf.TasksetConfig):
    task: AddTaskConfig = AddTaskConfig()


class AddTaskset(vf.Taskset[AddTask, AddConfig]):
    def load(self) -> Iterator[AddTask]:
        for index, (a, b) in enumerate(PAIRS):
            prompt = f"Use the add tool to compute {a}+{b}, then reply with just the number."
            yield AddTask(
                AddData(id=str(index), prompt=prompt, answer=str(a + b)), self.config.task
            )


__all__ = ["AddTaskset"]

if __name__ == "__main__":
    AddTools.run()
