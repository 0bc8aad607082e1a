"""``sluice.warm`` (the policy base class and its records) and ``sluice.warm_host`` (the
process the Rust runtime runs a Python policy in): JSON round trips, defaults, dispatch,
exception reporting and the stream discipline."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sluice.warm import Context, Event, Evict, Policy, Prefetch, Target
from sluice.warm_host import Host, serve

POLICY_SOURCE = """
import sys
from sluice.warm import Evict, Policy, Prefetch, Target

print("imported", file=sys.stdout)

class RestOfFile(Policy):
    def init(self, ctx):
        self.sizes = dict(ctx.files)
        return [Prefetch(ctx.files[0][0], 0, 10, Target.numa(0), stream=5)]

    def on_access(self, event):
        print("on_access", event.offset)
        start = event.offset + event.len
        end = self.sizes[event.path]
        return [Prefetch(event.path, start, end - start, Target.accelerator(1))]

    def evict(self, event):
        return [Evict(path, 0, size) for path, size in self.sizes.items()]

class Raises(Policy):
    def on_access(self, event):
        raise KeyError(event.path)

class WrongType(Policy):
    def on_access(self, event):
        return ["/m/a"]

class Duck:
    pass

NOT_A_CLASS = 3
"""

CTX = {"model_dir": "/m", "files": [["/m/a", 100], ["/m/b", 50]], "memory_limited": False}
EVENT = {"pid": 7, "worker": None, "path": "/m/a", "offset": 20, "len": 5, "kind": "read"}


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "warm_test_policies.py").write_text(POLICY_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "warm_test_policies"


def test_records_round_trip_through_their_json_form() -> None:
    assert Target.accelerator(2).to_json() == {"accelerator": 2}
    assert Target.from_json({"numa": 1}) == Target.numa(1)
    assert Target.from_json(None) is None
    with pytest.raises(ValueError, match="accelerator"):
        Target.from_json({"gpu": 0})
    p = Prefetch("/m/a", 4, 8)
    assert p.to_json() == {"stream": 0, "path": "/m/a", "offset": 4, "len": 8, "target": None}
    q = Prefetch("/m/b", 0, 1, Target.numa(3), stream=2)
    assert Prefetch.from_json(q.to_json()) == q
    e = Evict("/m/a", 0, 4096)
    assert Evict.from_json(e.to_json()) == e
    ctx = Context.from_json(CTX)
    assert ctx.files == [("/m/a", 100), ("/m/b", 50)]
    assert ctx.model_bytes == 150
    assert ctx.to_json() == CTX
    ev = Event.from_json(EVENT)
    assert (ev.pid, ev.worker, ev.offset, ev.kind) == (7, None, 20, "read")
    assert ev.to_json() == EVENT


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("kind", "write", "kind"), ("offset", "3", "offset"), ("pid", True, "pid")],
)
def test_malformed_events_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Event.from_json({**EVENT, field: value})


def test_the_base_class_does_nothing() -> None:
    p = Policy()
    assert p.init(Context("/m")) == []
    assert p.on_access(Event.from_json(EVENT)) == []
    assert p.evict(None) == []
    assert p.wait_for_init() is False
    assert p.exit() is None


def test_the_host_dispatches_each_call(module: str) -> None:
    host = Host(f"{module}:RestOfFile")
    assert host.handle({"call": "hello"}) == {"ok": "RestOfFile"}
    init = host.handle({"call": "init", "ctx": CTX})
    assert init == {
        "ok": [{"stream": 5, "path": "/m/a", "offset": 0, "len": 10, "target": {"numa": 0}}]
    }
    assert host.handle({"call": "wait_for_init"}) == {"ok": False}
    reply = host.handle({"call": "on_access", "event": EVENT})
    assert reply == {
        "ok": [{"stream": 0, "path": "/m/a", "offset": 25, "len": 75, "target": {"accelerator": 1}}]
    }
    evict = host.handle({"call": "evict", "event": None})
    assert evict == {
        "ok": [{"path": "/m/a", "offset": 0, "len": 100}, {"path": "/m/b", "offset": 0, "len": 50}]
    }
    assert host.handle({"call": "exit"}) == {"ok": None}


def test_exceptions_and_bad_requests_are_reported_not_raised(module: str) -> None:
    host = Host(f"{module}:Raises")
    reply = host.handle({"call": "on_access", "event": EVENT})
    assert reply["error"].startswith("KeyError: '/m/a'\n")
    assert "Traceback" in reply["error"] and "raise KeyError" in reply["error"]
    assert host.handle({"call": "teleport"})["error"].startswith("ValueError: unknown call")
    assert host.handle(["not", "an", "object"])["error"].startswith("ValueError")
    bad_event = host.handle({"call": "on_access", "event": {**EVENT, "kind": "poke"}})
    assert bad_event["error"].startswith("ValueError: event kind")
    wrong = Host(f"{module}:WrongType").handle({"call": "on_access", "event": EVENT})
    assert wrong["error"].startswith("TypeError: on_access must return Prefetch")


def test_a_duck_typed_class_gets_the_defaults(module: str) -> None:
    host = Host(f"{module}:Duck")
    assert host.handle({"call": "hello"}) == {"ok": "Duck"}
    assert host.handle({"call": "on_access", "event": EVENT}) == {"ok": []}
    assert host.handle({"call": "wait_for_init"}) == {"ok": False}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sluice_no_such_module:P", "ModuleNotFoundError: No module named 'sluice_no_such_module'"),
        ("{module}:Missing", "AttributeError"),
        ("{module}:NOT_A_CLASS", "TypeError"),
        ("no_colon", "ValueError: policy 'no_colon' is not of the form module:Class"),
    ],
)
def test_a_policy_that_cannot_load_fails_every_call(module: str, spec: str, message: str) -> None:
    host = Host(spec.format(module=module))
    hello = host.handle({"call": "hello"})
    assert hello["error"].startswith(message), hello
    assert host.handle({"call": "init", "ctx": CTX}) == hello
    out = io.StringIO()
    assert serve(host, io.StringIO('{"call": "hello"}\n{"call": "exit"}\n'), out) == 1
    assert out.getvalue().count("\n") == 1, "the host stops after a failed hello"


def test_serve_answers_one_line_per_request_and_stops_at_exit(module: str) -> None:
    requests = [
        {"call": "hello"},
        {"call": "init", "ctx": CTX},
        "not json",
        {"call": "on_access", "event": EVENT},
        {"call": "exit"},
        {"call": "hello"},
    ]
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests)
    out = io.StringIO()
    assert serve(Host(f"{module}:RestOfFile"), io.StringIO(text), out) == 0
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(replies) == 5, "nothing is answered after exit"
    assert replies[0] == {"ok": "RestOfFile"}
    assert replies[2]["error"].startswith("JSONDecodeError")
    assert replies[3]["ok"][0]["offset"] == 25
    assert replies[4] == {"ok": None}


def test_the_host_process_keeps_stdout_for_the_protocol(module: str, tmp_path: Path) -> None:
    requests = [{"call": "hello"}, {"call": "init", "ctx": CTX}]
    requests += [{"call": "on_access", "event": EVENT}, {"call": "exit"}]
    proc = subprocess.run(
        [sys.executable, "-m", "sluice.warm_host", f"{module}:RestOfFile"],
        input="".join(json.dumps(r) + "\n" for r in requests),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    replies = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [("ok" in r) for r in replies] == [True] * 4
    assert "imported" in proc.stderr and "on_access 20" in proc.stderr


def test_the_module_docstring_example_is_a_working_policy(tmp_path: Path) -> None:
    import sluice.warm as warm

    doc = warm.__doc__ or ""
    start = doc.rindex("\n", 0, doc.index("# mypolicy.py")) + 1
    end = doc.index("$ sluice warm run")
    (tmp_path / "mypolicy.py").write_text(textwrap.dedent(doc[start:end]))
    sys.path.insert(0, str(tmp_path))
    try:
        host = Host("mypolicy:RestOfFile")
        host.handle({"call": "init", "ctx": CTX})
        reply = host.handle({"call": "on_access", "event": EVENT})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mypolicy", None)
    assert reply["ok"] == [
        {"stream": 0, "path": "/m/a", "offset": 20, "len": 80, "target": {"accelerator": 0}}
    ]


def test_trigger_writes_one_json_line_to_the_runtimes_pipe(tmp_path, monkeypatch) -> None:
    import json
    import os

    from sluice import warm

    monkeypatch.setenv("SLUICE_RUN_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="no warm runtime is running"):
        warm.trigger("a.bin")
    me = os.getpid()
    (tmp_path / f"{me}.json").write_text("{}")
    (tmp_path / f"{2**22 + 12345}.json").write_text("{}")  # a pid that does not exist
    assert warm.running() == [me]
    fifo = tmp_path / f"{me}.trigger"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        warm.trigger("a.bin", 4096, worker=1)
        line = os.read(reader, 4096).decode()
    finally:
        os.close(reader)
    assert json.loads(line) == {"path": "a.bin", "offset": 4096, "len": None, "worker": 1}
    from sluice.errors import NoRuntimeError

    # A stale pid: named as no runtime listening (it was "os error 6", ENXIO).
    with pytest.raises(NoRuntimeError, match=f"pid {2**22 + 12345} listens on"):
        warm.trigger("a.bin", pid=2**22 + 12345)
    # Two live runtimes: the caller must choose; status() lists both by their file's pid.
    (tmp_path / f"{os.getppid()}.json").write_text('{"mode": "run", "policy": "eager"}')
    assert sorted(s["pid"] for s in warm.status()) == sorted([me, os.getppid()])
    assert {s["policy"] for s in warm.status()} == {"", "eager"}
    with pytest.raises(NoRuntimeError, match="2 runtimes are running"):
        warm.trigger("a.bin")


@pytest.mark.skipif(os.geteuid() != 0, reason="sluice warm run needs root (fanotify)")
def test_the_documented_policy_prefetches_under_a_stock_safetensors_loader(
    tmp_path: Path, sluice_bin: Path
) -> None:
    # The guide's RestOfFile (docs/guide/warm.md), verbatim. Its first version prefetched
    # 0 bytes: a mapping loader's event spans the whole file, so "after the access" was
    # empty. -vv logs each event and the policy's reply.
    readme = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "warm.md").read_text()
    start = readme.index("# mypolicy.py")
    (tmp_path / "mypolicy.py").write_text(readme[start : readme.index("```", start)])
    model = tmp_path / "model"
    model.mkdir()
    import torch
    from safetensors.torch import save_file

    save_file({f"t{i}": torch.zeros(256, 1024) for i in range(16)}, str(model / "m.safetensors"))
    from conftest import evict_from_page_cache

    # Written back first: a dirty page cannot be dropped, and cached pages are not prefetched.
    evict_from_page_cache(model / "m.safetensors")
    loader = "from safetensors.torch import load_file; import sys; load_file(sys.argv[1])"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    env["SLUICE_PYTHON"] = sys.executable
    warm = [sluice_bin, "-vv", "warm", "run", "--json", "--policy", "mypolicy:RestOfFile"]
    service = [sys.executable, "-c", loader, str(model / "m.safetensors")]
    done = subprocess.run(
        [*warm, "--model", str(model), "--", *service],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report.get("events", 0) == 0:
        pytest.skip(f"no access events on this file system: {report}")
    assert report["prefetched_bytes"] > 0, report
    assert "access answered" in done.stderr
