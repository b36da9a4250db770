"""Writes the demo's chat and Chinese eval sets and its code text from two PyPI wheels (data/chat/SOURCES.md).

    pip download chatterbot-corpus==1.2.0 six==1.17.0 --no-deps -d /tmp/w
    python data/chat/extract.py /tmp/w

Each YAML conversation of chatterbot-corpus (a list of lines, alternately the user's and the bot's) becomes one JSONL
line {"messages": [{"role": "user"|"assistant", "content": ...}], "source": "<language>/<file>#<n>"}. The English
categories are split in two disjoint halves: the gate's and the calibration's (a gate text never equals a
calibration text). six.py is copied as it is.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

import yaml

WHEELS = {  # file -> SHA256 (PyPI)
    "chatterbot_corpus-1.2.0-py2.py3-none-any.whl": "5caf9f02ea1b7fed5f4df39a210a66c3f5afa308b6fa6b635dffe0bbe75a3cdf",
    "six-1.17.0-py2.py3-none-any.whl": "4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274",
}
ENGLISH_GATE = ("ai", "computers", "emotion", "food", "gossip", "health", "history", "humor", "literature", "money")
ENGLISH_CALIB = ("botprofile", "conversations", "greetings", "movies", "politics", "psychology", "science", "sports",
                 "trivia")
OUT = Path(__file__).resolve().parent


def conversations(zf: zipfile.ZipFile, lang: str, names) -> list[str]:
    lines = []
    for name in names:
        data = yaml.safe_load(zf.read(f"chatterbot_corpus/data/{lang}/{name}.yml").decode("utf-8"))
        for n, conv in enumerate(data["conversations"]):
            turns = [str(t).strip() for t in conv if str(t).strip()]
            if len(turns) < 2:
                continue
            msgs = [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns)]
            lines.append(json.dumps({"messages": msgs, "source": f"{lang}/{name}.yml#{n}"}, ensure_ascii=False))
    return lines


def main(folder: str) -> None:
    d = Path(folder)
    for w, pin in WHEELS.items():
        got = hashlib.sha256((d / w).read_bytes()).hexdigest()
        if got != pin:
            sys.exit(f"{d / w}: SHA256 {got}, expected {pin}")
    with zipfile.ZipFile(d / "chatterbot_corpus-1.2.0-py2.py3-none-any.whl") as zf:
        chinese = sorted(Path(n).stem for n in zf.namelist() if n.startswith("chatterbot_corpus/data/chinese/"))
        for out, lang, names in (("chat-gate.jsonl", "english", ENGLISH_GATE),
                                 ("chat-calib.jsonl", "english", ENGLISH_CALIB),
                                 ("chinese-gate.jsonl", "chinese", chinese)):
            (OUT / out).write_text("\n".join(conversations(zf, lang, names)) + "\n", encoding="utf-8")
    with zipfile.ZipFile(d / "six-1.17.0-py2.py3-none-any.whl") as zf:
        (OUT.parent / "code-six.py.txt").write_bytes(zf.read("six.py"))
    for f in ("chat/chat-gate.jsonl", "chat/chat-calib.jsonl", "chat/chinese-gate.jsonl", "code-six.py.txt"):
        p = OUT.parent / f
        print(f, hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size)


if __name__ == "__main__":
    main(sys.argv[1])
