//! [`end_service`] over a scripted service and scripted processes: no
//! process is signalled for real.

use super::*;

/// A root process that ends on the signals in `ends_on` (with `code`, as a
/// trapping shell does; SIGKILL always ends it) or by itself after `runs`
/// looks.
struct Root {
    runs: u32,
    ends_on: Vec<i32>,
    code: i32,
    exit: Option<ServiceExit>,
    received: Vec<i32>,
    looks: u32,
}

impl Root {
    fn new(runs: u32, ends_on: &[i32]) -> Root {
        Root {
            runs,
            ends_on: ends_on.to_vec(),
            code: 0,
            exit: None,
            received: Vec::new(),
            looks: 0,
        }
    }
}

impl Service for Root {
    fn pid(&self) -> i32 {
        1
    }

    fn try_exit(&mut self) -> Result<Option<ServiceExit>, WarmError> {
        self.looks += 1;
        self.runs = self.runs.saturating_sub(1);
        if self.runs == 0 && self.exit.is_none() {
            self.exit = Some(ServiceExit::Code(self.code));
        }
        Ok(self.exit)
    }

    fn signal(&mut self, signal: i32) {
        if self.exit.is_some() {
            return;
        }
        self.received.push(signal);
        if signal == libc::SIGKILL {
            self.exit = Some(ServiceExit::Signal(signal));
        } else if self.ends_on.contains(&signal) {
            self.exit = Some(ServiceExit::Code(self.code));
        }
    }
}

/// Other processes of the service; they end on SIGTERM unless `stubborn`,
/// always on SIGKILL.
#[derive(Default)]
struct Others {
    pids: Vec<i32>,
    stubborn: bool,
    received: Vec<i32>,
}

impl ServiceProcesses for Others {
    fn pids(&mut self) -> Vec<i32> {
        self.pids.clone()
    }

    fn signal_all(&mut self, signal: i32) {
        self.received.push(signal);
        if signal == libc::SIGKILL || !self.stubborn {
            self.pids.clear();
        }
    }
}

const LONG: Duration = Duration::from_secs(3600);

fn stopped_by(signal: i32, from_terminal: bool) -> StopRequest {
    let stop = StopRequest::new();
    stop.request(signal, from_terminal);
    stop
}

#[test]
fn a_stop_signal_is_forwarded_and_a_service_ending_in_its_grace_period_is_not_killed() {
    let mut root = Root::new(u32::MAX, &[libc::SIGTERM]);
    root.code = 3;
    let mut others = Others::default();
    let stop = stopped_by(libc::SIGTERM, false);
    let ending = end_service(&mut root, &mut others, &stop, LONG).unwrap();
    assert_eq!(ending.exit, ServiceExit::Code(3));
    assert_eq!(
        (ending.stopped_by, ending.forwarded, ending.killed),
        (Some(libc::SIGTERM), true, 0)
    );
    assert_eq!(root.received, [libc::SIGTERM]);
}

#[test]
fn a_signal_from_the_terminal_is_not_sent_twice() {
    // The terminal's Ctrl-C reached the service too; it ends a few looks later.
    let mut root = Root::new(3, &[]);
    let stop = stopped_by(libc::SIGINT, true);
    let ending = end_service(&mut root, &mut Others::default(), &stop, LONG).unwrap();
    assert!(root.received.is_empty(), "{:?}", root.received);
    assert_eq!(
        (ending.stopped_by, ending.forwarded, ending.killed),
        (Some(libc::SIGINT), false, 0)
    );
}

#[test]
fn what_outlives_the_grace_period_is_killed() {
    let mut root = Root::new(u32::MAX, &[]);
    let mut others = Others {
        pids: vec![10, 11],
        stubborn: true,
        ..Others::default()
    };
    let stop = stopped_by(libc::SIGTERM, false);
    let ending = end_service(&mut root, &mut others, &stop, Duration::ZERO).unwrap();
    assert_eq!(ending.exit, ServiceExit::Signal(libc::SIGKILL));
    assert_eq!((ending.killed, ending.survivors), (2, 0));
    assert_eq!(root.received, [libc::SIGTERM, libc::SIGKILL]);
    assert_eq!(others.received, [libc::SIGKILL]);
}

#[test]
fn a_second_stop_request_kills_at_once() {
    let mut root = Root::new(u32::MAX, &[]);
    let stop = stopped_by(libc::SIGINT, true);
    stop.request(libc::SIGINT, true);
    let ending = end_service(&mut root, &mut Others::default(), &stop, LONG).unwrap();
    assert_eq!(ending.exit, ServiceExit::Signal(libc::SIGKILL));
    assert!(
        root.looks <= 3,
        "no waiting for the grace period: {} looks",
        root.looks
    );
}

#[test]
fn processes_an_exited_root_left_get_sigterm_then_the_grace_period() {
    let mut root = Root::new(1, &[]);
    root.code = 5;
    let mut others = Others {
        pids: vec![20, 21, 22],
        ..Others::default()
    };
    let ending = end_service(&mut root, &mut others, &StopRequest::new(), LONG).unwrap();
    assert_eq!(ending.exit, ServiceExit::Code(5));
    assert_eq!(
        (ending.stopped_by, ending.leftovers, ending.killed),
        (None, 3, 0)
    );
    assert_eq!(others.received, [libc::SIGTERM]);
    // Without leftovers nothing is signalled at all.
    let mut root = Root::new(1, &[]);
    let mut none = Others::default();
    let ending = end_service(&mut root, &mut none, &StopRequest::new(), LONG).unwrap();
    assert_eq!(
        ending,
        Ending {
            grace: LONG,
            ..Ending::exited(ServiceExit::Code(0))
        }
    );
    assert!(none.received.is_empty());
}

#[test]
fn a_process_tree_follows_a_child_its_root_left_behind() {
    // The shell prints its child's pid once it has forked it, then exits
    // when told to, leaving the child an orphan outside its tree.
    let mut shell = std::process::Command::new("sh")
        .args(["-c", "sleep 30 & echo $!; read _"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let root = shell.id() as i32;
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(shell.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let sleeper: i32 = line.trim().parse().unwrap();
    let mut tree = ProcessTree::new(root, None);
    let mut expected = vec![root, sleeper];
    expected.sort_unstable();
    assert_eq!(tree.pids(), expected);
    drop(shell.stdin.take());
    shell.wait().unwrap();
    assert_eq!(tree.pids(), [sleeper], "the orphan is still the service's");
    tree.kill_all();
    // Re-parented to init (or a subreaper), it is gone once reaped there.
    for _ in 0..500 {
        if running_since(sleeper).is_none() {
            break;
        }
        std::thread::sleep(POLL);
    }
    assert!(tree.pids().is_empty());
}
