"""Output files (zoo/files.py): whole or nothing, the user's mode, a link replaced (never its target), special
files written through and never replaced, exclusive publishing without --force."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time

import numpy as np
import pytest

from export import export_onnx
from export import writer as writer_mod
from helpers import one_line_error
from zoo import files
from zoo.errors import OutputPathError
from zoo.files import write_atomic


def _write(text: str):
    return lambda tmp: tmp.write_text(text)


def test_new_file_gets_the_umask_mode_not_the_temp_files(tmp_path):
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "r.json", _write("{}"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o640


def test_replaced_file_keeps_its_own_mode(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    target.chmod(0o604)
    write_atomic(target, _write("new"))
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o604


def test_symlink_is_replaced_never_written_through(tmp_path):
    real = tmp_path / "real" / "report.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_atomic(link, _write("new"), overwrite=False)
    assert link.is_symlink() and real.read_text() == "old"
    write_atomic(link, _write("new"))
    assert not link.is_symlink() and link.read_text() == "new" and real.read_text() == "old"
    assert not list(real.parent.glob(".attnzoo-*")) and not list(tmp_path.glob(".attnzoo-*"))


def test_dangling_symlink_is_replaced_and_a_dangling_folder_refused(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "nonexistent" / "dir" / "made.json")
    with pytest.raises(FileExistsError):
        write_atomic(link, _write("x"), overwrite=False)  # the name is taken, by a link to nothing
    write_atomic(link, _write("x"))
    assert not link.is_symlink() and link.read_text() == "x"
    folder = tmp_path / "out"
    folder.symlink_to(tmp_path / "gone" / "dir")  # a folder on the way
    with pytest.raises(OutputPathError, match=r"folder .*out is a dangling symlink \(to .*gone/dir, which does"):
        files.ensure_writable_parent(folder / "r.json")
    with pytest.raises(OutputPathError, match="dangling symlink"):
        write_atomic(folder / "r.json", _write("x"))
    assert not (tmp_path / "nonexistent").exists() and not (tmp_path / "gone").exists()  # no folder made


def test_a_linked_folder_on_the_way_is_followed(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real")
    write_atomic(tmp_path / "via" / "r.json", _write("x"))
    assert (tmp_path / "real" / "r.json").read_text() == "x"


def test_a_link_to_a_folder_or_a_pipe(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "to-d").symlink_to(tmp_path / "d")
    with pytest.raises(OutputPathError, match=r"to-d: it is a symlink to a folder \(.*d\); name a file"):
        write_atomic(tmp_path / "to-d", _write("x"))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "to-pipe").symlink_to(fifo)  # /dev/stdout is such a link
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomic(tmp_path / "to-pipe", _write("through the link"))
    reader.join(timeout=60)
    assert got == [b"through the link"] and (tmp_path / "to-pipe").is_symlink()


# -- every writer that takes -o / --json / --plot: --force replaces a link, never its target ------

LLAMA_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
}


def _export(link, tmp_path, monkeypatch):  # a block export whose weights go to LINK.data (also a link)
    from cli.main import main

    monkeypatch.setattr(writer_mod, "EXTERNAL_DATA_BYTES", 1000)
    argv = ["export", "mha-causal", "--set", "d_model=32", "--set", "heads=2", "--lowering", "decomposed"]
    assert main([*argv, "-o", str(link), "--force"]) == 0
    return [files.weights_file(link)]


def _json_report(link, tmp_path, monkeypatch):
    from cli.main import main

    assert main(["families", "--json", str(link)]) == 0
    return []


def _plot(link, tmp_path, monkeypatch):
    from cli.main import main

    assert main(["heads", "tiny-induction", "--plot", str(link)]) == 0
    return []


def _preset(link, tmp_path, monkeypatch):
    from cli.main import main

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    assert main(["preset", "--config", str(tmp_path), "--name", "my-llama", "-o", str(link), "--force"]) == 0
    return []


def _model_file(link, tmp_path, monkeypatch):
    from analysis import store

    store.save(store.load("tiny-induction"), "tiny-induction", link)
    return []


WRITERS = {  # the kind of writer: (the output's name, what writes it with --force)
    "export -o, and its .data": ("m.onnx", _export),
    "--json": ("report.json", _json_report),
    "--plot": ("heads.png", _plot),
    "preset -o": ("my-llama.toml", _preset),
    "a saved model": ("model.pt", _model_file),
}


@pytest.mark.parametrize("kind", list(WRITERS))
def test_force_replaces_the_link_not_the_file_it_points_at(kind, tmp_path, monkeypatch, capsys):
    keep = tmp_path / "elsewhere"
    keep.mkdir()
    name, write = WRITERS[kind]
    link = tmp_path / name
    (keep / "keep.txt").write_text("an unrelated file")
    link.symlink_to(keep / "keep.txt")
    if kind.startswith("export"):
        files.weights_file(link).symlink_to(keep / "keep.data.txt")  # a link to nothing beside it too
    beside = write(link, tmp_path, monkeypatch)
    for written in (link, *beside):
        assert written.is_file() and not written.is_symlink(), (kind, written)
    assert (keep / "keep.txt").read_text() == "an unrelated file"
    assert sorted(p.name for p in keep.iterdir()) == ["keep.txt"], kind  # no KEEP.data, nothing made there
    if kind.startswith("export"):
        from runtime import OnnxSession

        OnnxSession(link, provider="cpu", verbose=False).run(np.zeros((1, 2, 32), np.float32))


def test_export_without_force_leaves_a_link_and_its_target(tmp_path, capsys):
    keep = tmp_path / "keep.txt"
    keep.write_text("an unrelated file")
    link = tmp_path / "m.onnx"
    link.symlink_to(keep)
    line = one_line_error(capsys, ["export", "mha-causal", "--set", "d_model=32", "--set", "heads=2", "-o", str(link)])
    assert "exists" in line and "--force" in line
    assert link.is_symlink() and keep.read_text() == "an unrelated file"


def test_fifo_is_written_through_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, _write("through the pipe"), overwrite=False)
    reader.join(timeout=60)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert not list(tmp_path.glob(".attnzoo-*"))


def test_character_device_is_written_through_not_replaced():
    before = os.stat(os.devnull)
    write_atomic(os.devnull, _write("nothing"), overwrite=False)
    after = os.stat(os.devnull)
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_socket_and_folder_are_refused_with_one_line(tmp_path):
    sock_path = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock_path))
    try:
        with pytest.raises(OutputPathError, match="a socket"):
            write_atomic(sock_path, _write("x"))
    finally:
        s.close()
    with pytest.raises(OutputPathError, match="a folder"):
        write_atomic(tmp_path, _write("x"))
    with pytest.raises(OutputPathError, match="empty"):
        files.resolve_output("")


def test_ensure_writable_parent_names_the_users_path(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(OutputPathError) as e:
        files.ensure_writable_parent(tmp_path / "d")
    assert str(tmp_path / "d") in str(e.value) and ".attnzoo-" not in str(e.value)


def test_cli_json_report_to_dev_null_leaves_the_device(capsys):
    from cli.main import main

    assert main(["parity", "mha-causal", "--lowering", "ort-gqa", "--json", os.devnull]) == 0
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_publish_race_has_exactly_one_winner(tmp_path):
    target = tmp_path / "same.onnx"
    results: list[str] = []
    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        tmp = tmp_path / f".attnzoo-w{i}"
        tmp.write_text(f"writer {i}")
        barrier.wait()
        try:
            files.publish(tmp, target, overwrite=False)
            results.append(f"won {i}")
        except FileExistsError:
            results.append("lost")
            tmp.unlink()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r.startswith("won")]
    assert len(winners) == 1 and results.count("lost") == 7
    assert target.read_text() == f"writer {winners[0].split()[1]}"
    assert not list(tmp_path.glob(".attnzoo-*"))


def test_publish_without_hard_links_is_still_exclusive(tmp_path, monkeypatch):
    def no_link(src, dst):
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(files.os, "link", no_link)
    target = tmp_path / "m.onnx"
    a, b = tmp_path / ".attnzoo-a", tmp_path / ".attnzoo-b"
    a.write_text("a")
    b.write_text("b")
    files.publish(a, target, overwrite=False)
    with pytest.raises(FileExistsError):
        files.publish(b, target, overwrite=False)
    assert target.read_text() == "a"


def test_stale_temp_folders_are_swept_young_ones_kept(tmp_path):
    old, young = tmp_path / ".attnzoo-old", tmp_path / ".attnzoo-young"
    old.mkdir()
    young.mkdir()
    (old / "half.onnx").write_bytes(b"killed mid-write")
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    files.ensure_writable_parent(tmp_path / "m.onnx")
    assert not old.exists() and young.exists()


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_heads_picture_is_written_in_the_format_its_suffix_names(tmp_path, suffix, capsys):
    from cli.main import main

    out = tmp_path / f"heads{suffix}"
    assert main(["heads", "tiny-induction", "--plot", str(out)]) == 0
    magic = {".png": b"\x89PNG", ".svg": b"<?xml", ".pdf": b"%PDF"}[suffix]
    assert out.read_bytes().startswith(magic)


def test_heads_picture_to_dev_null_leaves_the_device(capsys):
    from cli.main import main

    assert main(["heads", "tiny-induction", "--plot", os.devnull]) == 0
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.parametrize("flag", ["--plot", "--json"])
def test_heads_output_that_is_a_folder_is_refused_before_any_scoring(tmp_path, flag, monkeypatch, capsys):
    import analysis
    from cli.main import main

    monkeypatch.setattr(analysis, "load", lambda name: pytest.fail("scored before the output was checked"))
    assert main(["heads", "tiny-induction", flag, str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(tmp_path) in err and ".attnzoo-" not in err and len(err.splitlines()) == 1


def test_heads_picture_with_an_unknown_suffix_is_refused(tmp_path, capsys):
    from cli.main import main

    assert main(["heads", "tiny-induction", "--plot", str(tmp_path / "x.gif")]) == 2
    assert ".png, .svg, .pdf" in capsys.readouterr().err


# -- no-overwrite cannot be raced; an unwritable target is named before any work ---------------


def test_export_that_loses_the_race_refuses_and_leaves_the_winner(tmp_path, monkeypatch):
    target = tmp_path / "same.onnx"
    real = writer_mod.lower

    def slow_lower(*a, **kw):
        out = real(*a, **kw)
        target.write_bytes(b"the other export's model")  # another process finished first
        return out

    monkeypatch.setattr(writer_mod, "lower", slow_lower)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_onnx("mha-separate-nobias", target, lowering="decomposed")
    assert target.read_bytes() == b"the other export's model"
    assert not list(tmp_path.glob(".attnzoo-*"))


def test_unwritable_target_is_named_before_any_work(monkeypatch, capsys):
    def never(*a, **kw):
        raise AssertionError("the export ran before the output folder was checked")

    monkeypatch.setattr(writer_mod, "lower", never)
    line = one_line_error(capsys, ["export", "mha-causal", "-o", "/proc/attnzoo-test.onnx"])
    assert "/proc/attnzoo-test.onnx" in line and ".attnzoo-" not in line
