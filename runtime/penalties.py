"""OpenAI's logit adjustments as logits processors (numpy, no torch), each called as transformers calls its
processors: `proc(input_ids (b t) int64, scores (b v) float32) -> scores`, the ids being the prompt and the
tokens made so far.

    procs = [OpenAIPenalties(prompt_len=t, frequency=0.5, presence=0.3), LogitBias({50256: -100})]
    for proc in procs:
        scores = proc(input_ids, scores)

`OpenAIPenalties` is OpenAI's formula (platform.openai.com/docs/advanced-usage, "Frequency and presence
penalties"), over the tokens generated so far (the prompt's are not counted, as vLLM states it:
sampling_params.py, "penalizes new tokens based on their frequency in the generated text so far"):

    logit[j] -= count[j] * frequency_penalty + (count[j] > 0) * presence_penalty

`LogitBias` adds each listed token's bias (OpenAI's -100..100) to its logit, as OpenAI and vLLM apply it.
Both run before the sampler's own processors and warpers (runtime/sampling.py), on the model's logits.
"""

from __future__ import annotations

import numpy as np

import zoo

PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's range for frequency_penalty and presence_penalty
BIAS_RANGE = (-100.0, 100.0)  # OpenAI's range for a logit_bias value


def _finite(name: str, value, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise zoo.ArgumentError(f"{name}={value!r} must be a number in {low:g}..{high:g}")
    return float(value)


class OpenAIPenalties:
    """OpenAI's frequency and presence penalties over the tokens after the first `prompt_len` of each row."""

    def __init__(self, prompt_len: int, frequency: float = 0.0, presence: float = 0.0) -> None:
        self.prompt_len = int(prompt_len)
        self.frequency = _finite("frequency_penalty", frequency, *PENALTY_RANGE)
        self.presence = _finite("presence_penalty", presence, *PENALTY_RANGE)

    @property
    def active(self) -> bool:
        return self.frequency != 0 or self.presence != 0

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        made = np.asarray(input_ids)[:, self.prompt_len :]
        if not self.active or made.shape[1] == 0:
            return scores
        b, v = scores.shape
        counts = np.zeros((b, v), np.float32)
        rows = np.repeat(np.arange(b), made.shape[1])
        inside = (made >= 0) & (made < v)  # an id past the logits (none in a real run) counts nowhere
        np.add.at(counts, (rows[inside.ravel()], made.ravel()[inside.ravel()]), 1)
        out = scores - counts * np.float32(self.frequency) - (counts > 0) * np.float32(self.presence)
        return out.astype(scores.dtype, copy=False)


class LogitBias:
    """OpenAI's logit_bias: {token id: bias in -100..100} added to those tokens' logits."""

    def __init__(self, bias: dict, vocab: int) -> None:
        if not isinstance(bias, dict):
            raise zoo.ArgumentError(f"logit_bias={bias!r} must map token ids to numbers in -100..100")
        ids, values = [], []
        for key, value in bias.items():
            text = str(key)
            if not (text.isascii() and text.isdigit()) or not 0 <= int(text) < vocab:
                raise zoo.ArgumentError(f"logit_bias key {key!r} is not a token id of this vocabulary (0..{vocab - 1})")
            ids.append(int(text))
            values.append(_finite(f"logit_bias[{key}]", value, *BIAS_RANGE))
        self.ids = np.asarray(ids, np.int64)
        self.values = np.asarray(values, np.float32)

    @property
    def active(self) -> bool:
        return len(self.ids) > 0

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if not self.active:
            return scores
        out = np.array(scores, copy=True)
        np.add.at(out, (slice(None), self.ids), self.values.astype(out.dtype))  # a repeated id: both add
        return out


__all__ = ["BIAS_RANGE", "PENALTY_RANGE", "LogitBias", "OpenAIPenalties"]
