from copy import deepcopy

from osmosis_ai.rollout import RolloutSample, SampleSource


class MySampleSource(SampleSource):
    def __init__(self, messages: list[dict]):
        self._messages = messages

    async def get_sample(self) -> RolloutSample:
        return RolloutSample(messages=list(self._messages))

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        if max_messages <= 0:
            return None
        return RolloutSample(messages=deepcopy(self._messages[-max_messages:]))
