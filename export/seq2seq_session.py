"""Moved to runtime/seq2seq_session.py (it runs sessions; the run time imports no torch): this name stays for
the code and docs that import `export.seq2seq_session.Seq2SeqSession`."""

from runtime.seq2seq_session import Seq2SeqSession

__all__ = ["Seq2SeqSession"]
