import asyncio

from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowContext


class TracingWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        if ctx.artifacts_dir:
            log_file = ctx.artifacts_dir / "run.log"
            await asyncio.to_thread(log_file.write_text, "started\n")
        ...
