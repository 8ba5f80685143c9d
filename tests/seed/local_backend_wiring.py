from osmosis_ai.rollout import LocalBackend

from tests.seed.search_workflow import SearchWorkflow, search_workflow_config

backend = LocalBackend(
    workflow=SearchWorkflow,
    workflow_config=search_workflow_config,
)
