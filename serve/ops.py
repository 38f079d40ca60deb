"""The operations settings of a whole-model server (`attnzoo serve --max-waiting --request-timeout
--prefix-cache-mb --access-log --log-prompts`; docs/serving.md "Operations", "Admission control", "Prefix
caching"), checked before anything starts."""

from __future__ import annotations

from dataclasses import dataclass

from .schema import ServeError

DEFAULT_PREFIX_CACHE_MB = 256.0


@dataclass(frozen=True)
class ServeOps:
    """max_waiting: requests queued (not yet running) past which a request is refused with 429 (None: no bound);
    request_timeout: seconds from arrival after which a request ends (None: none); prefix_cache_mb: the prefix
    cache's bound per replica (0: off); access_log: a file the access-log lines are appended to (None: the
    replica's log); log_prompts: the prompt's text in each access-log line."""

    max_waiting: int | None = None
    request_timeout: float | None = None
    prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB
    access_log: str | None = None
    log_prompts: bool = False

    def __post_init__(self) -> None:
        n = self.max_waiting
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ServeError(f"max_waiting={n!r} must be a positive integer (or None: no bound)")
        s = self.request_timeout
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not s > 0):
            raise ServeError(f"request_timeout={s!r} must be a positive number of seconds (or None: none)")
        mb = self.prefix_cache_mb
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not 0 <= mb <= 1 << 20:
            raise ServeError(f"prefix_cache_mb={mb!r} must be between 0 (off) and {1 << 20}")

    def batcher_options(self, observer=None) -> dict:
        """RowBatcher's keyword options: a prefix cache of its own per batcher (generate.prefix.PrefixCache)."""
        from .generate.prefix import PrefixCache

        prefix = PrefixCache(int(self.prefix_cache_mb * 2**20)) if self.prefix_cache_mb > 0 else None
        return {
            "max_waiting": self.max_waiting,
            "timeout_s": self.request_timeout,
            "prefix": prefix,
            "observer": observer,
        }


__all__ = ["DEFAULT_PREFIX_CACHE_MB", "ServeOps"]
