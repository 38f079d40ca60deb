import json
import subprocess
import sys

import pytest

from cli.main import main
from helpers import REPO, one_line_error

ROOT = REPO


def test_export_run_and_refusal(tmp_path, capsys):
    out = tmp_path / "m.onnx"
    assert main(["export", "mha-causal", "-o", str(out), "--lowering", "decomposed", "--mask", "--weights"]) == 0
    text = capsys.readouterr().out
    assert "wrote" in text and "mask bool[b, t, t]" in text
    assert (
        main(
            [
                "run",
                str(out),
                "--provider",
                "cpu",
                "--batch",
                "3",
                "--seq",
                "11",
                "--repeats",
                "2",
                "--placement",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "y (3, 11, 64)" in text and "attn (3, 4, 11, 11)" in text and "provider  cpu" in text
    assert "latency" in text and "placement" in text
    assert main(["export", "mha-causal", "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err


def test_run_reports_missing_and_corrupt_files(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.onnx")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.onnx"
    bad.write_text("not onnx")
    assert main(["run", str(bad), "--provider", "cpu"]) != 0


def test_parity_cli_prints_matrix_and_json(tmp_path, capsys):
    js = tmp_path / "p.json"
    rc = main(
        [
            "parity",
            "mha-separate-nobias",
            "--lowering",
            "decomposed",
            "--lowering",
            "onnx-attention",
            "--json",
            str(js),
            "-q",
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    assert "| mha-separate-nobias | onnx-attention | cpu | float32 | masked |" in text
    rows = json.loads(js.read_text())
    assert len(rows) == 4 and all(r["status"] == "PASS" for r in rows)


def test_parity_cli_refuses_cuda_it_cannot_run_and_auto_skips_it(capsys):
    from runtime.session import cuda_status

    ok, why = cuda_status()
    if ok:
        pytest.skip("this machine has a working CUDA provider")
    # Asked for by name, a provider that cannot run fails (a CI job must not go green on nothing).
    assert main(["parity", "mha-separate-nobias", "--provider", "cuda", "--lowering", "decomposed", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--provider cuda" in err and why in err
    # auto: CPU, and CUDA only where it works (one line says so).
    args = ["parity", "mha-causal", "--provider", "auto", "--lowering", "ort-gqa", "--case", "plain", "-q"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "| cpu |" in out and "| cuda |" not in out and "no CUDA" in err


def test_export_script_is_the_cli(tmp_path):
    out = tmp_path / "s.onnx"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "export_onnx.py"),
            "mqa",
            "-o",
            str(out),
            "--dtype",
            "float16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert out.is_file() and "float16" in r.stdout


def test_help_for_every_command(capsys):
    """`python -m cli --help` in a fresh process (the entry point), then every command's --help in this one."""
    r = subprocess.run([sys.executable, "-m", "cli", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "usage: attnzoo" in r.stdout, r.stderr
    from cli.main import build_parser, command_parsers

    commands = command_parsers(build_parser())
    assert {"list", "show", "audit", "export", "run", "parity", "bench", "generate", "heads", "patch"} <= set(commands)
    for cmd in commands:
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        assert e.value.code == 0 and "usage: attnzoo" in capsys.readouterr().out, cmd


# -- attnzoo run: sizes past the machine, -s on a self-attention model -------------------------


def test_run_past_the_machine_is_refused_before_inputs_are_made(exports, capsys):
    line = one_line_error(capsys, ["run", str(exports["decomposed"]), "-b", "100000", "-t", "100000"])
    assert "needs about" in line and "(100000, 100000, 100000)" in line


def test_ctx_seq_on_a_self_attention_model_is_refused(exports, capsys):
    assert "self-attention" in one_line_error(capsys, ["run", str(exports["decomposed"]), "-s", "5"])


@pytest.mark.parametrize("tf32", [False, True])
def test_run_and_parity_hand_tf32_to_the_session(tmp_path, capsys, monkeypatch, tf32):
    """--tf32 reaches OnnxSession (run) and every parity row's session; without it, tf32=False (use_tf32=0 on CUDA)."""
    import runtime.session

    seen = []
    real = runtime.session.OnnxSession.__init__

    def spy(self, *args, **kw):
        seen.append(kw.get("tf32"))
        real(self, *args, **kw)

    monkeypatch.setattr(runtime.session.OnnxSession, "__init__", spy)
    out = tmp_path / "m.onnx"
    assert main(["export", "mha-causal", "-o", str(out), "--lowering", "decomposed"]) == 0
    flag = ["--tf32"] if tf32 else []
    assert main(["run", str(out), "--provider", "cpu", "--repeats", "1", *flag]) == 0
    args = ["parity", "mha-causal", "--lowering", "decomposed", "--case", "plain", "--json", str(tmp_path / "p.json")]
    assert main([*args, *flag]) == 0
    capsys.readouterr()
    assert seen and set(seen) == {tf32}, seen
    assert [r["tf32"] for r in json.loads((tmp_path / "p.json").read_text())] == [tf32]
