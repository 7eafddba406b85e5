//! Progress bars for long studies, shown only when stderr is a terminal so logs and CI output
//! stay clean.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// A bar, or nothing when stderr is not a terminal.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    pub fn inc(&self, n: u64) {
        if let Some(b) = &self.0 {
            b.inc(n);
        }
    }

    pub fn set_message(&self, msg: String) {
        if let Some(b) = &self.0 {
            b.set_message(msg);
        }
    }

    /// Prints a line to stdout without tearing the bar drawn on stderr.
    pub fn println(&self, line: &str) {
        match &self.0 {
            Some(b) => b.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

fn bar(len: u64, template: &str, what: &str) -> Progress {
    if !std::io::stderr().is_terminal() {
        return Progress(None);
    }
    let b = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(template) {
        b.set_style(style);
    }
    b.set_message(what.to_string());
    Progress(Some(b))
}

/// A bar that fills over `seconds` of wall time by itself.
pub fn for_duration(seconds: Option<u64>, what: &str) -> Progress {
    let Some(s) = seconds else {
        return Progress(None);
    };
    let p = bar(s, "{msg} [{bar:40}] {pos}/{len} s", what);
    if let Some(b) = &p.0 {
        let b = b.clone();
        std::thread::spawn(move || {
            while !b.is_finished() && b.position() < b.length().unwrap_or(0) {
                std::thread::sleep(Duration::from_secs(1));
                b.inc(1);
            }
        });
    }
    p
}

/// A bar over `steps` units of work.
pub fn for_steps(steps: u64, what: &str) -> Progress {
    bar(steps, "{msg} [{bar:40}] {pos}/{len} ({eta} left)", what)
}
