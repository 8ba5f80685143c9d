from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowContext, get_rollout_context
from osmosis_ai.rollout.integrations.agents.strands import (
    OsmosisRolloutModel,
    OsmosisStrandsAgent,
)


class PrivateStrandsWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        rollout_context = get_rollout_context()
        if rollout_context is not None:
            rollout_context.preview_enabled = False
        agent = OsmosisStrandsAgent(
            model=OsmosisRolloutModel(),
            messages=ctx.prompt,
            callback_handler=None,
        )
        await agent.invoke_async()
