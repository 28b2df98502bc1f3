//! A throwaway Postgres cluster of the test's own (`initdb` + `pg_ctl` on a
//! free port), so that a test may stop and start the server under its
//! workers. initdb refuses to run as root: as root the cluster runs as the
//! `postgres` user.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian's Postgres 15 keeps its server programs.
const BIN_DIR: &str = "/usr/lib/postgresql/15/bin";

pub struct Cluster {
    data: PathBuf,
    log: PathBuf,
    pub port: u16,
    /// Runs commands as this user (`None`: as ourselves).
    user: Option<&'static str>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// A new cluster, started; `None` (with a note) where the Postgres
    /// programs are missing.
    pub fn start() -> Option<Cluster> {
        Cluster::start_auth(None)
    }

    /// With `password`, TCP logins need it (scram-sha-256) for user
    /// `postgres`: the only way to test a wrong password where the
    /// machine's own server trusts every local login.
    pub fn start_auth(password: Option<&str>) -> Option<Cluster> {
        if !Path::new(BIN_DIR).join("initdb").exists() {
            eprintln!("no {BIN_DIR}/initdb: the throwaway-cluster test did not run");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("jobdeck-pgcluster-")
            .tempdir()
            .expect("temp dir");
        let root = nix::unistd::geteuid().is_root();
        let user = root.then_some("postgres");
        if root {
            // The postgres user must be able to reach and own its data dir.
            chown_postgres(dir.path());
        }
        let port = free_port();
        let cluster = Cluster {
            data: dir.path().join("data"),
            log: dir.path().join("server.log"),
            port,
            user,
            _dir: dir,
        };
        let data = cluster.data.to_string_lossy().into_owned();
        let initdb = format!("{BIN_DIR}/initdb");
        let mut argv = vec![&*initdb, "-D", &data, "-U", "postgres", "--no-sync"];
        let pwfile = cluster._dir.path().join("pw");
        let pwfile_arg = format!("--pwfile={}", pwfile.display());
        match password {
            None => argv.extend(["-A", "trust"]),
            Some(pw) => {
                std::fs::write(&pwfile, pw).expect("write the password file");
                if root {
                    chown_postgres(&pwfile);
                }
                argv.extend([
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    &*pwfile_arg,
                ]);
            }
        }
        cluster.run(&argv);
        cluster.start_server();
        Some(cluster)
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The URL logging in as `postgres` with `password`.
    #[allow(dead_code)] // tests/bad_input.rs
    pub fn url_with_password(&self, password: &str) -> String {
        format!(
            "postgres://postgres:{password}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    pub fn start_server(&self) {
        self.run(&[
            &format!("{BIN_DIR}/pg_ctl"),
            "-D",
            &self.data.to_string_lossy(),
            "-l",
            &self.log.to_string_lossy(),
            "-o",
            &format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
                self.port,
                self.data.display()
            ),
            "-w",
            "start",
        ]);
    }

    /// `pg_ctl stop -m fast`: every connection is cut.
    pub fn stop_server(&self) {
        self.run(&[
            &format!("{BIN_DIR}/pg_ctl"),
            "-D",
            &self.data.to_string_lossy(),
            "-m",
            "fast",
            "-w",
            "stop",
        ]);
    }

    /// `argv` as the cluster's user.
    fn command(&self, argv: &[&str]) -> Command {
        let mut cmd = match self.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).args(argv);
                c
            }
            None => {
                let mut c = Command::new(argv[0]);
                c.args(&argv[1..]);
                c
            }
        };
        // pg_ctl hands its stdout to the server: never the test's pipes.
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .current_dir("/");
        cmd
    }

    fn run(&self, argv: &[&str]) {
        let out = self
            .command(argv)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap_or_else(|e| panic!("run {argv:?}: {e}"));
        assert!(
            out.status.success(),
            "{argv:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.data.to_string_lossy().into_owned();
        let pg_ctl = format!("{BIN_DIR}/pg_ctl");
        let _ = self
            .command(&[&pg_ctl, "-D", &data, "-m", "immediate", "stop"])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn chown_postgres(dir: &Path) {
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .expect("running as root needs a postgres user for initdb");
    nix::unistd::chown(dir, Some(user.uid), Some(user.gid)).expect("chown the cluster dir");
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free port")
        .port()
}
