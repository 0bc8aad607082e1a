//! The Python-policy tests: real policies in a real `sluice.warm_host`
//! (skipped where no interpreter has the `sluice` package), fake hosts
//! written in sh for the faults Python will not produce, and the pure
//! parts (reply checks, environment) directly.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use super::protocol::{parse_evictions, parse_prefetches, FieldError, ReplyError};
use super::*;
use crate::error::WarmError;
use crate::policy::{
    AccessEvent, AccessKind, FileRange, Guarded, PolicyContext, Prefetch, Target, WarmPolicy,
};

/// A tempdir with `module.py` holding `source`, a two-file model, and
/// a config whose PYTHONPATH has the module.
struct Fixture {
    dir: tempfile::TempDir,
    config: PythonConfig,
    ctx: PolicyContext,
}

fn fixture(module: &str, source: &str) -> Option<Fixture> {
    let python = sluice_testkit::python_with_sluice()?;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(format!("{module}.py")), source).unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    let files = vec![(model.join("a.bin"), 1000), (model.join("b.bin"), 400)];
    for (path, size) in &files {
        std::fs::write(path, vec![0u8; *size as usize]).unwrap();
    }
    let config = PythonConfig {
        python: Some(python),
        call_timeout: Duration::from_millis(200),
        startup_timeout: Duration::from_secs(10),
        python_path: vec![dir.path().to_path_buf()],
    };
    let ctx = PolicyContext {
        model_dir: model,
        files,
        memory_limited: true,
    };
    Some(Fixture { dir, config, ctx })
}

fn read(path: &Path, offset: u64, len: u64) -> AccessEvent {
    AccessEvent {
        pid: 42,
        worker: Some(3),
        path: path.to_path_buf(),
        offset,
        len,
        kind: AccessKind::Read,
    }
}

fn host_pid(policy: &PythonPolicy) -> i32 {
    policy.host.as_ref().expect("running").child.id() as i32
}

fn is_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

const REST_OF_FILE: &str = "\
import sys
from sluice.warm import Evict, Policy, Prefetch, Target

class RestOfFile(Policy):
    def init(self, ctx):
        self.sizes = dict(ctx.files)
        self.limited = ctx.memory_limited
        first, size = ctx.files[0]
        return [Prefetch(first, 0, 100, Target.numa(1), stream=9)]

    def wait_for_init(self):
        return self.limited

    def on_access(self, event):
        start = event.offset + event.len
        end = self.sizes[event.path]
        return [Prefetch(event.path, start, end - start, Target.accelerator(event.worker),
                         stream=event.worker)]

    def evict(self, event):
        if event is None:
            return [Evict(path, 0, size) for path, size in self.sizes.items()]
        return [Evict(event.path, 0, event.offset)]

    def exit(self):
        print('exit called', file=sys.stderr)
";

#[test]
fn a_working_policy_prefetches_evicts_and_exits_cleanly() {
    let Some(f) = fixture("restpol", REST_OF_FILE) else {
        return;
    };
    let mut policy = spawn_with("restpol:RestOfFile", &f.config).unwrap();
    assert_eq!(
        (policy.name(), policy.class_name()),
        ("restpol:RestOfFile", "RestOfFile")
    );
    let (a, b) = (f.ctx.files[0].0.clone(), f.ctx.files[1].0.clone());
    let init = policy.init(&f.ctx).unwrap();
    let expected = FileRange::new(&a, 0, 100).with_target(Target::NumaNode(1));
    assert_eq!(
        init,
        [Prefetch {
            stream: 9,
            range: expected
        }]
    );
    assert!(policy.wait_for_init(), "memory_limited went through");
    let plan = policy.on_access(&read(&a, 200, 50)).unwrap();
    let expected = FileRange::new(&a, 250, 750).with_target(Target::Accelerator(3));
    assert_eq!(
        plan,
        [Prefetch {
            stream: 3,
            range: expected
        }]
    );
    assert_eq!(
        policy.evict(Some(&read(&b, 300, 1))).unwrap(),
        [FileRange::new(&b, 0, 300)]
    );
    assert_eq!(policy.evict(None).unwrap().len(), 2);
    let pid = host_pid(&policy);
    policy.exit().unwrap();
    assert!(!is_alive(pid), "the host ended and was reaped");
    let err = policy.on_access(&read(&a, 0, 1)).unwrap_err();
    assert!(err.to_string().contains("gone"), "{err}");
}

/// Whether `pid` is gone or a zombie, waiting up to 5 s for whoever
/// reaps it (init, once its parent is gone).
fn dies(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().to_string())
            });
        match state {
            None => return true,
            Some(rest) if rest.starts_with('Z') => return true,
            Some(_) if Instant::now() >= deadline => return false,
            Some(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

#[test]
fn a_child_the_policy_forked_dies_with_the_host() {
    let Some(f) = fixture("forkpol", sluice_testkit::FORKING_POLICY) else {
        return;
    };
    let mut policy = spawn_with("forkpol:Forks", &f.config).unwrap();
    policy.init(&f.ctx).unwrap();
    let child: i32 = std::fs::read_to_string(f.dir.path().join("child.pid"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(is_alive(child));
    // The host exits cleanly on `exit`; its forked child must not outlive it.
    policy.exit().unwrap();
    assert!(dies(child), "the forked child {child} still runs");
}

#[test]
fn an_exception_is_a_fault_with_the_traceback_and_the_host_is_killed() {
    let source = "\
from sluice.warm import Policy

class Raises(Policy):
    def on_access(self, event):
        raise ValueError(f'boom at {event.offset}')
";
    let Some(f) = fixture("raisepol", source) else {
        return;
    };
    let mut policy = spawn_with("raisepol:Raises", &f.config).unwrap();
    assert!(policy.init(&f.ctx).unwrap().is_empty());
    assert!(!policy.wait_for_init(), "the base class default");
    let pid = host_pid(&policy);
    let err = policy
        .on_access(&read(&f.ctx.files[0].0, 7, 1))
        .unwrap_err();
    let WarmError::Policy { name, message } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(name, "raisepol:Raises");
    assert!(message.starts_with("ValueError: boom at 7"), "{message}");
    assert!(message.contains("Traceback"), "{message}");
    assert!(!is_alive(pid), "killed on the fault");
    let again = policy.evict(None).unwrap_err().to_string();
    assert!(
        again.contains("gone") && again.contains("boom at 7"),
        "{again}"
    );
}

#[test]
fn a_sleeping_policy_misses_its_deadline_and_is_disabled_promptly() {
    let source = "\
import time
from sluice.warm import Policy

class Sleeps(Policy):
    def on_access(self, event):
        time.sleep(5)
        return []
";
    let Some(f) = fixture("sleeppol", source) else {
        return;
    };
    let policy = spawn_with("sleeppol:Sleeps", &f.config).unwrap();
    let pid = host_pid(&policy);
    let mut guarded = Guarded::new(Box::new(policy));
    assert!(guarded.init(&f.ctx).is_empty());
    let started = Instant::now();
    assert!(guarded.on_access(&read(&f.ctx.files[0].0, 0, 1)).is_empty());
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(1200),
        "{took:?}"
    );
    let fault = guarded.fault().expect("disabled");
    assert!(fault.contains("within 200 ms"), "{fault}");
    assert!(!is_alive(pid), "the sleeper was killed");
}

#[test]
fn prints_to_stdout_do_not_corrupt_the_protocol() {
    let source = "\
import os
from sluice.warm import Policy, Prefetch

print('importing')

class Chatty(Policy):
    def init(self, ctx):
        print('init', ctx)
        os.write(1, b'not json, straight to fd 1\\n')
        return []

    def on_access(self, event):
        print('{\"ok\": []}')
        return [Prefetch(event.path, 0, 1)]
";
    let Some(f) = fixture("chattypol", source) else {
        return;
    };
    let mut policy = spawn_with("chattypol:Chatty", &f.config).unwrap();
    assert!(policy.init(&f.ctx).unwrap().is_empty());
    let a = &f.ctx.files[0].0;
    let plan = policy.on_access(&read(a, 5, 1)).unwrap();
    assert_eq!(plan[0].range, FileRange::new(a, 0, 1));
    policy.exit().unwrap();
}

#[test]
fn a_range_outside_the_model_files_is_a_fault() {
    let source = "\
from sluice.warm import Policy, Prefetch

class Escapes(Policy):
    def on_access(self, event):
        return [Prefetch(event.path, 0, 1), Prefetch('/etc/passwd', 0, 4096)]
";
    let Some(f) = fixture("escapepol", source) else {
        return;
    };
    let mut policy = spawn_with("escapepol:Escapes", &f.config).unwrap();
    policy.init(&f.ctx).unwrap();
    let pid = host_pid(&policy);
    let err = policy
        .on_access(&read(&f.ctx.files[1].0, 0, 1))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("prefetch 1") && err.contains("\"/etc/passwd\" is not one of the model"),
        "{err}"
    );
    assert!(!is_alive(pid));
}

#[test]
fn a_module_or_class_that_cannot_be_loaded_fails_spawn_with_the_python_error() {
    let source = "import sluice_no_such_dependency\n";
    let Some(f) = fixture("brokenpol", source) else {
        return;
    };
    std::fs::write(f.dir.path().join("fine.py"), "X = 1\n").unwrap();
    let cases = [
        ("brokenpol:P", "No module named 'sluice_no_such_dependency'"),
        ("sluice_absent_mod:P", "No module named 'sluice_absent_mod'"),
        ("fine:Missing", "AttributeError"),
        ("fine:X", "not a class"),
    ];
    for (spec, needle) in cases {
        let err = spawn_with(spec, &f.config).err().expect("spawn fails");
        let text = err.to_string();
        assert!(
            matches!(&err, PythonError::Raised { spec: s, .. } if s == spec),
            "{spec}: {err:?}"
        );
        assert!(
            text.contains(spec) && text.contains(needle),
            "{spec}: {text}"
        );
    }
}

#[test]
fn bad_specs_are_refused_before_any_process_starts() {
    for bad in [
        "native", "a.b", ":C", "a:", "a..b:C", "1a:C", "a b:C", "a:C:D", "a-b:C", "",
    ] {
        let config = PythonConfig {
            python: Some("/nonexistent/python".into()),
            ..PythonConfig::default()
        };
        let err = spawn_with(bad, &config).err().expect("refused");
        assert!(
            matches!(&err, PythonError::BadSpec { spec } if spec == bad),
            "{bad:?}: {err:?}"
        );
        assert!(err.to_string().contains("module:Class"), "{bad:?}: {err}");
    }
    for good in ["a.b:C", "m:Outer.Inner", "_x:Y", "pkg.mod_2:Policy_1"] {
        assert!(validate_spec(good).is_ok(), "{good}");
    }
    let config = PythonConfig {
        python: Some("/nonexistent/python".into()),
        ..PythonConfig::default()
    };
    let err = spawn_with("a:B", &config).err().expect("no interpreter");
    let PythonError::Start { spec, python, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(
        (spec.as_str(), python.as_path()),
        ("a:B", Path::new("/nonexistent/python"))
    );
    assert!(err.to_string().contains("/nonexistent/python"), "{err}");
    assert!(err.to_string().contains("SLUICE_PYTHON"), "{err}");
}

/// `super::spawn_with`, retried while the fake interpreter is "busy": a test writes its
/// script just before running it, and another test's fork in this process can hold a copy of
/// the write descriptor until its child execs (ETXTBSY, seen once in make test). That says
/// nothing about the policy host, so it is waited out.
fn spawn_with(spec: &str, config: &PythonConfig) -> Result<PythonPolicy, PythonError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match super::spawn_with(spec, config) {
            Err(PythonError::Start { source, .. })
                if source.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => return other,
        }
    }
}

/// A fake host: a shell script answering `hello`, then `reply`.
fn fake_host(dir: &Path, reply: &str) -> PythonConfig {
    let script = dir.join("fakepython");
    let body =
        format!("#!/bin/sh\nread line\necho '{{\"ok\": \"Fake\"}}'\nread line\n{reply}\nsleep 5\n");
    std::fs::write(&script, body).unwrap();
    let mut perms = std::fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&script, perms).unwrap();
    PythonConfig {
        python: Some(script),
        call_timeout: Duration::from_millis(300),
        ..PythonConfig::default()
    }
}

#[test]
fn garbage_replies_and_an_exiting_host_are_faults() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = PolicyContext {
        model_dir: "/m".into(),
        files: vec![("/m/a".into(), 10)],
        memory_limited: false,
    };
    let cases = [
        ("echo 'this is not json'", "not JSON"),
        ("echo '{\"ok\": 3}'", "expected a list of prefetch objects"),
        ("echo '{\"result\": []}'", "not {\"ok\""),
        ("exit 3", "exited (exit status: 3)"),
        ("printf '{\"ok\": []'", "within 300 ms"),
    ];
    for (reply, needle) in cases {
        let config = fake_host(dir.path(), reply);
        let mut policy = spawn_with("fake:Fake", &config).unwrap();
        let started = Instant::now();
        let err = policy.init(&ctx).unwrap_err().to_string();
        assert!(err.contains(needle), "{reply}: {err}");
        assert!(started.elapsed() < Duration::from_secs(2), "{reply}");
    }
    // A host that dies before saying hello.
    let config = fake_host(dir.path(), "");
    std::fs::write(config.python.as_ref().unwrap(), "#!/bin/sh\nexit 1\n").unwrap();
    let err = spawn_with("fake:Fake", &config).err().expect("no hello");
    assert!(
        matches!(
            &err,
            PythonError::HostFailed {
                source: HostError::Exited { .. },
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("before saying hello"), "{text}");
    assert!(text.contains("is the sluice package installed"), "{text}");
}

#[test]
fn a_host_that_does_not_answer_hello_with_the_class_name_fails_spawn() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = fake_host(dir.path(), "");
    let script = config.python.clone().unwrap();
    std::fs::write(
        &script,
        "#!/bin/sh\nread line\necho '{\"ok\": 3}'\nsleep 5\n",
    )
    .unwrap();
    let err = spawn_with("fake:Fake", &config).err().expect("bad hello");
    assert!(
        matches!(&err, PythonError::BadHello { reply, .. } if reply == &json!(3)),
        "{err:?}"
    );
    assert!(err.to_string().contains("not the class name"), "{err}");
    // Silent until killed: the start-up deadline, not the call deadline.
    std::fs::write(&script, "#!/bin/sh\nread line\nsleep 5\n").unwrap();
    config.startup_timeout = Duration::from_millis(300);
    let err = spawn_with("fake:Fake", &config).err().expect("no hello");
    assert!(
        matches!(
            &err,
            PythonError::HelloTimedOut {
                timeout_ms: 300,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("is importing it this slow"),
        "{err}"
    );
}

#[test]
fn replies_are_checked_field_by_field() {
    let files: HashMap<PathBuf, PathBuf> = [("/m/a".into(), "/m/a".into())].into();
    let ok = parse_prefetches(
        json!([{"path": "/m/./a", "offset": 1, "len": 2},
                   {"path": "/m/a", "offset": 0, "len": 1, "stream": 4, "target": {"numa": 2}}]),
        &files,
    )
    .unwrap();
    assert_eq!(ok[0].range, FileRange::new("/m/a", 1, 2));
    assert_eq!((ok[1].stream, ok[1].range.target), (4, Target::NumaNode(2)));
    let bad = [
        (
            json!([{"path": "m/a", "offset": 0, "len": 1}]),
            "not absolute",
        ),
        (
            json!([{"path": "/m/b", "offset": 0, "len": 1}]),
            "not one of",
        ),
        (
            json!([{"path": "/m/a", "offset": -1, "len": 1}]),
            "\"offset\"",
        ),
        (json!([{"path": "/m/a", "offset": 0}]), "\"len\""),
        (
            json!([{"path": "/m/a", "offset": 0, "len": 1.5}]),
            "\"len\"",
        ),
        (
            json!([{"path": "/m/a", "offset": 0, "length": 1}]),
            "unknown field",
        ),
        (json!([{"path": 3, "offset": 0, "len": 1}]), "\"path\""),
        (
            json!([{"path": "/m/a", "offset": 0, "len": 1, "stream": 1u64 << 40}]),
            "\"stream\"",
        ),
        (
            json!([{"path": "/m/a", "offset": 0, "len": 1, "target": {"gpu": 0}}]),
            "target",
        ),
        (json!([7]), "not an object"),
        (json!({"path": "/m/a"}), "expected a list"),
    ];
    for (value, needle) in bad {
        let err = parse_prefetches(value.clone(), &files).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(needle), "{value}: {text}");
    }
    let err = parse_evictions(
        json!([{"path": "/m/a", "offset": 0, "len": 1, "stream": 0}]),
        &files,
    )
    .unwrap_err();
    let ReplyError::BadItem { what, index, fault } = &err else {
        panic!("{err:?}");
    };
    assert_eq!((*what, *index), ("eviction", 0));
    assert!(
        matches!(fault, FieldError::Unknown { key } if key == "stream"),
        "{fault:?}"
    );
    assert!(
        err.to_string().contains("unknown field \"stream\""),
        "{err}"
    );
    let err = parse_prefetches(
        json!([{"path": "/m/a", "offset": 0, "len": 1}, {"path": "/m/a", "offset": 0, "len": -1}]),
        &files,
    )
    .unwrap_err();
    let ReplyError::BadItem {
        index: 1, fault, ..
    } = &err
    else {
        panic!("{err:?}");
    };
    let FieldError::NotAnInteger { key, got } = fault else {
        panic!("{fault:?}");
    };
    assert_eq!((*key, got), ("len", &json!(-1)));
}

#[test]
fn the_environment_sets_the_interpreter_and_the_deadline() {
    let vars = |timeout: &'static str| {
        move |name: &str| match name {
            "SLUICE_PYTHON" => Some(OsString::from("/opt/py/bin/python")),
            "SLUICE_PY_POLICY_TIMEOUT_MS" => Some(OsString::from(timeout)),
            _ => None,
        }
    };
    let config = PythonConfig::from_vars(vars("1500")).unwrap();
    assert_eq!(config.python, Some(PathBuf::from("/opt/py/bin/python")));
    assert_eq!(config.call_timeout, Duration::from_millis(1500));
    for bad in ["0", "-5", "soon", ""] {
        let err = PythonConfig::from_vars(vars(bad)).unwrap_err();
        let PythonError::BadEnv { name, value, .. } = &err else {
            panic!("{bad}: {err:?}");
        };
        assert_eq!(
            (*name, value.as_str()),
            ("SLUICE_PY_POLICY_TIMEOUT_MS", bad)
        );
        let text = err.to_string();
        assert!(
            text.contains("SLUICE_PY_POLICY_TIMEOUT_MS"),
            "{bad}: {text}"
        );
    }
    let defaults = PythonConfig::from_vars(|_| None).unwrap();
    assert_eq!(defaults.python, None);
    assert_eq!(defaults.call_timeout, DEFAULT_CALL_TIMEOUT);
}
