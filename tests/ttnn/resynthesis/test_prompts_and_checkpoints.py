# SPDX-License-Identifier: Apache-2.0
"""``--model DIR`` trains on DIR's own tokenizer, ``--prompts FILE`` on the user's prompts, and a
child checkpoint resumes only the run it belongs to: another parent, precision, feature dtype,
prompt set or width, and an unreadable checkpoint, are refused with exit 2 and a message naming
what differs, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from models.resynthesis.waves import prompt_set_sha256
from models.testing.resynthesis_world import World, losses, report

# One torch thread: losses are compared bit for bit across runs (automatic threads follow the load).
SMALL = ("--min-tokens", "4", "--max-tokens", "12", "--batch-size", "2", "--threads", "1")


def _refused(done, *words: str) -> str:
    assert done.returncode == 2, done.stdout[-3000:]
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr, (word, done.stderr[-3000:])
    return done.stderr


def test_model_dir_with_a_tokenizer_trains_on_its_text(world: World, tmp_path):
    done = world.demo("--prompts", "4", "--epochs", "1", *SMALL, "--no-cache", "--json", tmp_path / "text.json")
    assert done.returncode == 0, done.stderr[-3000:]
    trained = report(tmp_path / "text.json")
    assert trained["kind"].startswith("text prompts")
    # The same prompts computed by a fresh process (pytest changes stdlib docstrings in its own:
    # it replaces threading.excepthook, one of the documented functions the text is made of).
    code = ("import sys\nfrom pathlib import Path\nfrom models.demos.resynthesis import prompts\n"
            "from models.resynthesis.waves import prompt_set_sha256\n"
            "print(prompt_set_sha256(prompts.text(4, 4, 12, Path(sys.argv[1]), seed=0)))")
    expected = subprocess.run([sys.executable, "-c", code, str(world.model)], env=world.env(), capture_output=True,
                              text=True, check=True, timeout=300).stdout.split()[-1]
    assert trained["prompts_sha256"] == expected
    bare = world.main("--prompts", "4", "--epochs", "1", *SMALL, "--no-cache", "--json", tmp_path / "bare.json",
                      model=world.bare)
    assert bare.returncode == 0 and report(tmp_path / "bare.json")["kind"].startswith("synthetic")
    _refused(world.main("--prompts", "4", "--prompt-kind", "text", *SMALL, model=world.bare), "needs a tokenizer")


def test_prompt_files_of_text_and_of_token_ids(world: World, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(world.model)
    lines = ["Return the first item of an iterable.", "", "Open a file and return a stream."]
    (tmp_path / "prompts.txt").write_text("\n".join(lines) + "\n")
    done = world.main("--prompts", tmp_path / "prompts.txt", "--epochs", "1", "--no-cache", "--json",
                      tmp_path / "text.json")
    assert done.returncode == 0, done.stdout
    expected = [torch.tensor(tokenizer(line)["input_ids"]) for line in lines if line]
    assert report(tmp_path / "text.json")["prompts_sha256"] == prompt_set_sha256(expected)
    assert report(tmp_path / "text.json")["prompts"] == 2

    records = [[5, 6, 7, 8], {"tokens": [9, 10, 11]}, {"text": "Return the first item"}, "Open a file"]
    (tmp_path / "mixed.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    done = world.main("--prompts", tmp_path / "mixed.jsonl", "--epochs", "1", "--no-cache", "--json",
                      tmp_path / "mixed.json")
    assert done.returncode == 0, done.stdout
    expected = [torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10, 11]),
                torch.tensor(tokenizer("Return the first item")["input_ids"]),
                torch.tensor(tokenizer("Open a file")["input_ids"])]
    assert report(tmp_path / "mixed.json")["prompts_sha256"] == prompt_set_sha256(expected)

    # Token ids need no tokenizer.
    (tmp_path / "ids.jsonl").write_text("[1, 2, 3]\n[4, 5]\n")
    assert world.main("--prompts", tmp_path / "ids.jsonl", "--epochs", "1", "--no-cache",
                      model=world.bare).returncode == 0


def test_bad_prompt_files_are_exit_2_naming_the_line(world: World, tmp_path):
    cases = {
        "text-without-tokenizer.txt": ("a text prompt\n", world.bare, "text-without-tokenizer.txt:1", "no tokenizer"),
        "vocab.jsonl": ("[1, 2]\n[3, 512]\n", world.model, "vocab.jsonl:2", "token ids must be in [0, 512)"),
        "empty.txt": ("\n\n", world.model, "empty.txt", "holds no prompts"),
        "broken.jsonl": ("[1, 2\n", world.model, "broken.jsonl:1", "not JSON"),
        "shape.jsonl": ('{"ids": [1]}\n', world.model, "shape.jsonl:1", "a list of token ids"),
        "empty-ids.jsonl": ("[]\n", world.model, "empty-ids.jsonl:1", "an empty prompt"),
    }
    for name, (content, model, *words) in cases.items():
        (tmp_path / name).write_text(content)
        _refused(world.main("--prompts", tmp_path / name, "--no-cache", model=model), *words)
    _refused(world.main("--prompts", tmp_path / "missing.txt"), "no such prompt file")
    _refused(world.main("--prompts", tmp_path), "not a file")
    _refused(world.main("--prompts", "0"), "no such prompt file")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    _refused(world.main("--prompts", tmp_path / "latin1.txt"), "cannot read prompt file")
    # And as a real process: one line, exit 2.
    _refused(world.demo("--prompts", tmp_path / "vocab.jsonl"), "vocab.jsonl:2")


def test_a_checkpoint_resumes_only_its_own_run(world: World, tmp_path):
    checkpoint = tmp_path / "child.pt"
    base = ("--prompts", "4", *SMALL, "--prefill-cache", tmp_path / "prefill", "--checkpoint", checkpoint)
    first = world.main(*base, "--epochs", "1", "--json", tmp_path / "first.json")
    assert first.returncode == 0, first.stdout
    whole = world.main(*base[:-2], "--epochs", "2", "--json", tmp_path / "whole.json")
    assert whole.returncode == 0
    for other in (("--precision", "bfloat8_b"), ("--feature-dtype", "bfloat16"), ("--prompts", "5"),
                  ("--seed", "1"), ("--width", "32")):
        words = {"--precision": ("precision: checkpoint 'bfloat16', this run 'bfloat8_b'",),
                 "--feature-dtype": ("featureDtype: checkpoint 'float32', this run 'bfloat16'",),
                 "--prompts": ("prompts.count: checkpoint 4, this run 5", "prompts.sha256"),
                 "--seed": ("seed: checkpoint 0, this run 1", "prompts.sha256"),  # text windows move too
                 "--width": ("another training configuration", "width: checkpoint 64, this run 32")}[other[0]]
        _refused(world.main(*base, *other, "--epochs", "2"), str(checkpoint), *words)
    resumed = world.main(*base, "--epochs", "2", "--json", tmp_path / "resumed.json")
    assert resumed.returncode == 0, resumed.stdout
    assert [e["epoch"] for e in report(tmp_path / "resumed.json")["epochs"]] == [1, 2]
    assert losses(tmp_path / "resumed.json") == losses(tmp_path / "whole.json")


def test_a_checkpoint_of_another_parent_is_refused(world: World, tmp_path):
    checkpoint = tmp_path / "child.pt"
    base = ("--prompts", "4", "--prompt-kind", "synthetic", *SMALL, "--no-cache", "--checkpoint", checkpoint)
    assert world.main(*base, "--epochs", "1", model=world.bare).returncode == 0
    stderr = _refused(world.main(*base, "--epochs", "2", model=world.other), "parent.weightsSha256",
                      "parent.checkpointId")
    assert "prompts" not in stderr.split("trained on something else:")[1].split(". Resume")[0]  # same prompts
    assert "training configuration" not in stderr


def test_unreadable_checkpoints_are_exit_2(world: World, tmp_path):
    base = ("--prompts", "4", *SMALL, "--no-cache", "--epochs", "1")
    good = tmp_path / "good.pt"
    assert world.main(*base, "--checkpoint", good).returncode == 0
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    _refused(world.main(*base, "--checkpoint", garbage), "is not a readable child checkpoint")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    _refused(world.main(*base, "--checkpoint", truncated), "truncated.pt is not a readable child checkpoint")
    _refused(world.main(*base, "--checkpoint", tmp_path), "is a directory")
    older = tmp_path / "older.pt"
    state = torch.load(good, weights_only=True)
    state["schema"] = "tt-warm-loaders.resynthesis.child_checkpoint.v1"
    torch.save(state, older)
    _refused(world.main(*base, "--checkpoint", older), "written before checkpoints recorded their parent")
    not_a_dict = tmp_path / "list.pt"
    torch.save([1, 2, 3], not_a_dict)
    _refused(world.main(*base, "--checkpoint", not_a_dict), "is not a child checkpoint")
    damaged = tmp_path / "damaged.pt"
    state = torch.load(good, weights_only=True)
    del state["child"]["out.weight"]
    torch.save(state, damaged)
    _refused(world.main(*base, "--checkpoint", damaged), "is damaged")
    # And as a real process: one line, exit 2.
    _refused(world.demo(*base, "--checkpoint", garbage), "garbage.pt")
