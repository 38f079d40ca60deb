"""Beam search as transformers' `generate(num_beams=k, do_sample=False)` does it (generation/utils.py
`_beam_search` and its helpers, transformers 5.x), in numpy: the decoding loops of decoders
(runtime/beam_generation.py) and encoder-decoders (runtime/seq2seq_beam.py) feed it each step's logits and
reorder their cache by the rows it returns.

    beams = beam_settings({"num_beams": 4}, generation_config)       # the call over the checkpoint's
    search = BeamSearch(prompt, beams, max_length, eos, pad)          # prompt (b t): b x k running rows
    reorder = search.advance(logits)      # logits (b*k v) of the step -> each new row's source row (b*k,)
    tokens = search.tokens                # (b*k,) the next step's inputs, once the cache is reordered
    sequences, scores = search.result()   # (b * num_return_sequences, P + made), sequences_scores

The rules, as there: each step the log-softmax of the logits goes through the processors (a callable
`(ids (b*k, cur_len) int64, scores (b*k, v) float32) -> scores`), is added to each beam's score, and the best
max(2, 1 + number of eos ids) x k continuations of a batch row are kept; those ending at an eos id or at
max_length (or max_time) join the row's finished hypotheses if among the first k, scored by their sum over
(generated length) ** length_penalty (the generated length counts the eos, from the decoder prompt's end:
the padded prompt of a decoder, the start token of an encoder-decoder), and the best k others run on.
early_stopping True ends a row once it holds k finished hypotheses; False and "never" end it once the best
running beam cannot beat the worst finished one (False: at the current length, "never": at max_length when
length_penalty > 0, else at the current length). Scores are float32 with transformers' -1e9 marks, so
hypotheses tie and order as there. A hypothesis shorter than the longest returned is filled with the pad id
(with no pad id, the first eos id; with no eos id, -1), as transformers fills it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import zoo

MASKED = np.float32(-1.0e9)  # transformers' mark of a beam that must not be chosen
KEYS = ("num_beams", "length_penalty", "early_stopping", "num_return_sequences")
DEFAULTS = {"num_beams": 1, "length_penalty": 1.0, "early_stopping": False, "num_return_sequences": 1}


@dataclass(frozen=True)
class Beams:
    """What a beam search keeps and returns (transformers' GenerationConfig fields of the same names)."""

    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1

    def __post_init__(self) -> None:
        def whole(name, v):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise zoo.ArgumentError(f"{name}={v!r} must be an int >= 1")

        whole("num_beams", self.num_beams)
        whole("num_return_sequences", self.num_return_sequences)
        lp = self.length_penalty
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not np.isfinite(lp):
            raise zoo.ArgumentError(f"length_penalty={lp!r} must be a finite number (1 divides by the length)")
        if not (self.early_stopping is True or self.early_stopping is False or self.early_stopping == "never"):
            raise zoo.ArgumentError(f"early_stopping={self.early_stopping!r} must be True, False or 'never'")
        if self.num_return_sequences > self.num_beams:
            raise zoo.ArgumentError(
                f"num_return_sequences={self.num_return_sequences} must be <= num_beams={self.num_beams}: "
                "a beam search returns its best hypotheses, at most one per beam"
            )

    @property
    def on(self) -> bool:
        return self.num_beams > 1


def beam_settings(call: dict, config: dict | None = None) -> Beams:
    """The call's beam options (None = not given) over `config` (a generation_config.json's) over transformers'
    defaults. num_return_sequences > 1 without beams is refused (independent greedy rows would be one row)."""
    merged = dict(DEFAULTS)
    for k in KEYS:
        if config and config.get(k) is not None:
            merged[k] = config[k]
    merged.update({k: v for k, v in call.items() if v is not None})
    if isinstance(merged["length_penalty"], (int, np.integer)) and not isinstance(merged["length_penalty"], bool):
        merged["length_penalty"] = float(merged["length_penalty"])
    if merged["num_beams"] == 1:  # without beams num_return_sequences is the sampler's (runtime/sampling.py)
        merged["num_return_sequences"] = 1
    return Beams(**merged)


def split_beam_options(options: dict) -> tuple[dict, dict]:
    """(the beam options among `options`, the others)."""
    return {k: options[k] for k in KEYS if k in options}, {k: v for k, v in options.items() if k not in KEYS}


def without_beams(call: dict, options: dict, config: dict | None) -> dict:
    """The options of a greedy or sampled run (no beams): a call's num_return_sequences goes back to them, where
    the sampler takes it (several sampled sequences a row; greedy refuses it, as transformers does); a call's
    num_beams (1) overrides the checkpoint's in the run's generation_config, so the run does not say it unapplied."""
    n = call.get("num_return_sequences")
    out = options if n is None else {**options, "num_return_sequences": n}
    if call.get("num_beams") is not None and isinstance(config, dict):
        out = {**out, "generation_config": {**config, "num_beams": call["num_beams"]}}
    return out


def log_softmax32(logits: np.ndarray) -> np.ndarray:
    """(n v) -> (n v) float32, as torch.log_softmax of float32 logits."""
    x = np.asarray(logits, np.float32)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True, dtype=np.float32))


def topk(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k largest (values, indices), largest first, ties by the lower index: torch.topk's order."""
    m = x.shape[1]
    idx = np.argpartition(-x, k - 1, axis=1)[:, :k] if k < m else np.broadcast_to(np.arange(m), x.shape)
    vals = np.take_along_axis(x, idx, 1)
    order = np.lexsort((idx, -vals), axis=-1)
    return np.take_along_axis(vals, order, 1), np.take_along_axis(idx, order, 1)


def _gather(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """x (b m ...) -> (b r ...): each batch row's entries at `rows` (b r), as transformers' _gather_beams."""
    return np.take_along_axis(x, rows.reshape(rows.shape + (1,) * (x.ndim - 2)), 1)


class BeamSearch:
    """The state of one beam search over a batch (the module docstring): running and finished hypotheses."""

    def __init__(self, prompt: np.ndarray, beams: Beams, max_length: int, eos, pad, processors=None) -> None:
        b, t = prompt.shape
        k = beams.num_beams
        if max_length <= t:
            raise zoo.ArgumentError(f"max_length={max_length} leaves no new token after a prompt of {t}")
        self.b, self.k, self.prompt_len, self.max_length = b, k, t, max_length
        self.beams, self.processors = beams, processors
        self.eos = np.array(list(eos), np.int64)
        self.fill = -1 if not len(self.eos) else (pad if pad else int(self.eos[0]))  # transformers' `pad or eos[0]`
        self.keep = max(2, 1 + len(self.eos)) * k
        self.top_mask = np.arange(self.keep) < k
        self.running = np.full((b, k, max_length), self.fill, np.int64)
        self.running[:, :, :t] = prompt[:, None]
        self.sequences = self.running.copy()
        self.running_scores = np.zeros((b, k), np.float32)
        self.running_scores[:, 1:] = MASKED  # the first step reads beam 0 only: every beam holds the prompt
        self.scores = np.full((b, k), MASKED, np.float32)
        self.finished = np.zeros((b, k), np.bool_)
        self.unsatisfied = np.ones((b, 1), np.bool_)
        self.running_from = np.full((b, k, max_length - t), -1, np.int64)  # the flat source row of each step
        self.sequences_from = self.running_from.copy()
        self.cur_len = t
        self.done = False

    @property
    def rows(self) -> int:
        return self.b * self.k

    @property
    def tokens(self) -> np.ndarray:
        """(b*k,) the tokens the last step chose, the next step's inputs."""
        return self.running[:, :, self.cur_len - 1].reshape(-1)

    def ids(self) -> np.ndarray:
        """(b*k, cur_len) the running sequences, as the processors see them."""
        return self.running[:, :, : self.cur_len].reshape(self.rows, self.cur_len)

    def advance(self, logits: np.ndarray, stop: bool = False) -> np.ndarray:
        """One step from the logits (b*k v) of the running rows -> (b*k,) the row each new running row continues
        (reorder the cache by it before the next step). stop: every continuation ends here (max_time)."""
        b, k, cur, p = self.b, self.k, self.cur_len, self.prompt_len
        bs = self.beams
        scores = log_softmax32(logits)
        if self.processors is not None:
            scores = np.asarray(self.processors(self.ids(), scores), np.float32)
        v = scores.shape[-1]
        acc = (scores.reshape(b, k, v) + self.running_scores[:, :, None]).reshape(b, k * v)
        top_scores, top_index = topk(acc, self.keep)
        source = top_index // v
        top_tokens = top_index % v
        top_seqs = _gather(self.running, source)
        top_seqs[:, :, cur] = top_tokens
        top_from = _gather(self.running_from, source)
        top_from[:, :, cur - p] = source + np.arange(b)[:, None] * k
        if stop or cur + 1 >= self.max_length:
            hits = np.ones(top_tokens.shape, np.bool_)
        else:
            hits = np.isin(top_tokens, self.eos) if len(self.eos) else np.zeros(top_tokens.shape, np.bool_)

        # the best k continuations that did not end run on
        run_scores = top_scores + hits.astype(np.float32) * MASKED
        nxt = topk(run_scores, k)[1]
        self.running = _gather(top_seqs, nxt)
        self.running_scores = _gather(run_scores, nxt)
        self.running_from = _gather(top_from, nxt)

        # the ended among the first k join the finished ones if better
        just = hits & self.top_mask[None, :]
        ended = top_scores / np.float32((cur + 1 - p) ** bs.length_penalty)
        full = self.finished.all(axis=1, keepdims=True) & (bs.early_stopping is True)
        ended = ended + full.astype(np.float32) * MASKED
        ended = ended + (~self.unsatisfied).astype(np.float32) * MASKED
        ended = ended + (~just).astype(np.float32) * MASKED
        merged_scores = np.concatenate([self.scores, ended], 1)
        best = topk(merged_scores, k)[1]
        self.sequences = _gather(np.concatenate([self.sequences, top_seqs], 1), best)
        self.scores = _gather(merged_scores, best)
        self.sequences_from = _gather(np.concatenate([self.sequences_from, top_from], 1), best)
        self.finished = _gather(np.concatenate([self.finished, just], 1), best)

        reorder = self.running_from[:, :, cur - p].reshape(-1)
        self.cur_len = cur = cur + 1
        if bs.early_stopping == "never" and bs.length_penalty > 0.0:
            hypothetical = self.max_length - p
        else:
            hypothetical = cur - p
        best_running = self.running_scores[:, :1] / np.float32(hypothetical**bs.length_penalty)
        worst = np.where(self.finished, self.scores.min(axis=1, keepdims=True), MASKED)
        self.unsatisfied &= (best_running > worst).any(axis=-1, keepdims=True)
        open_beam = not (self.finished.all() and bs.early_stopping is True)
        self.done = not (self.unsatisfied.any() and open_beam and not hits.all())
        return reorder

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(sequences (b * num_return_sequences, P + longest made) int64, sequences_scores (that many,) float32),
        each batch row's best first."""
        n = self.beams.num_return_sequences
        seqs = self.sequences[:, :n].reshape(self.b * n, -1)
        made = int((self.sequences_from[:, :n] != -1).sum(axis=-1).max())
        return seqs[:, : self.prompt_len + made].copy(), self.scores[:, :n].reshape(-1).copy()


__all__ = ["DEFAULTS", "KEYS", "BeamSearch", "Beams", "beam_settings", "log_softmax32", "split_beam_options", "topk"]
