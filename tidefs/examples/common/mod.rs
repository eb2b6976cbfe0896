//! Helpers shared by the examples: their numeric arguments and the directories they work in.

use tidefs::fs::{Creds, Fs, Ino, ROOT_INO};

/// Argument `i` parsed as a number, `default` when absent; exits with a message naming
/// `what` when it is not a number.
pub fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T, what: &str) -> T {
    match args.get(i).map(|s| s.parse()) {
        None => default,
        Some(Ok(v)) => v,
        Some(Err(_)) => {
            eprintln!("{what} must be a number");
            std::process::exit(2);
        }
    }
}

/// The directory `name` under the root, made if missing.
pub fn dir(fs: &Fs, name: &[u8]) -> Ino {
    match fs.lookup(ROOT_INO, name) {
        Ok(a) => a.ino,
        Err(_) => {
            fs.mkdir(ROOT_INO, name, 0o755, Creds::ROOT)
                .expect("mkdir")
                .ino
        }
    }
}
