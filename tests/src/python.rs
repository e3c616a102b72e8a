//! The Python SDK (`sdk-python/`) from the Rust tests: an interpreter that has the package,
//! and a Python participant process.
//!
//! The interpreter is `DTX_PYTHON` if set (`.ci/run` sets it), else `target/py-venv`, created
//! with `python3 -m venv` and `pip install -e sdk-python[test]` the first time. When neither
//! works the test is skipped - unless `CI=true`, where it fails.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::db::in_ci;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// A Python interpreter with the `dtx` package and its test extra, or `None` (outside CI) when
/// none can be had.
pub fn python() -> Option<PathBuf> {
    if let Ok(python) = std::env::var("DTX_PYTHON") {
        return Some(PathBuf::from(python));
    }
    let venv = repo().join("target/py-venv");
    let python = venv.join("bin/python");
    if python.exists() {
        return Some(python);
    }
    let made = run(Command::new("python3").arg("-m").arg("venv").arg(&venv)).and_then(|()| {
        run(Command::new(&python)
            .args(["-m", "pip", "install", "-q", "-e"])
            .arg(repo().join("sdk-python[test]")))
    });
    match made {
        Ok(()) => Some(python),
        Err(why) => {
            let _ = std::fs::remove_dir_all(&venv);
            assert!(
                !in_ci(),
                "no Python for the SDK tests (CI=true: must not skip): {why}"
            );
            eprintln!("skipped: no Python for the SDK tests: {why}");
            None
        }
    }
}

fn run(command: &mut Command) -> Result<(), String> {
    let status = command.status().map_err(|e| format!("{command:?}: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("{command:?}: {status}"))
}

/// `sdk-python/tests/participant_app.py` on a SQLite file: saga steps `ship` (succeeds, writes
/// a ledger row; so does its compensation) and `fail` (refuses). Killed when dropped.
pub struct PythonParticipant {
    /// gRPC URL of the participant.
    pub url: String,
    child: Child,
}

impl PythonParticipant {
    pub fn start(python: &Path, sqlite_file: &Path) -> PythonParticipant {
        Self::spawn(python, sqlite_file, None, None)
    }

    /// One that obeys only calls signed by the coordinator whose public key (PEM) is in
    /// `call_public_key`.
    pub fn start_verifying(
        python: &Path,
        sqlite_file: &Path,
        call_public_key: &Path,
    ) -> PythonParticipant {
        Self::spawn(python, sqlite_file, None, Some(call_public_key))
    }

    /// One serving TLS with `identity`, requiring client certificates of `client_ca` (mTLS).
    pub fn start_tls(
        python: &Path,
        sqlite_file: &Path,
        identity: &crate::pki::Identity,
        client_ca: &Path,
    ) -> PythonParticipant {
        Self::spawn(python, sqlite_file, Some((identity, client_ca)), None)
    }

    fn spawn(
        python: &Path,
        sqlite_file: &Path,
        tls: Option<(&crate::pki::Identity, &Path)>,
        call_public_key: Option<&Path>,
    ) -> PythonParticipant {
        let mut command = Command::new(python);
        if let Some(key) = call_public_key {
            command.env("DTX_CALL_PUBLIC_KEY", key);
        }
        if let Some((identity, client_ca)) = tls {
            command
                .env("DTX_TLS_CERT", &identity.cert)
                .env("DTX_TLS_KEY", &identity.key)
                .env("DTX_TLS_CLIENT_CA", client_ca);
        }
        let mut child = command
            .arg(repo().join("sdk-python/tests/participant_app.py"))
            .arg(sqlite_file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the Python participant");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("read the Python participant's port");
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the Python participant said {line:?}"));
        let scheme = if tls.is_some() { "https" } else { "http" };
        PythonParticipant {
            url: format!("{scheme}://127.0.0.1:{port}"),
            child,
        }
    }
}

impl Drop for PythonParticipant {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
