//! Embeds the source commit in the binary as `LOWBIT_SOURCE_COMMIT` (bench records carry it):
//! `git rev-parse HEAD`, with `-dirty` appended when `git status --porcelain` lists anything, or `unknown` without git.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(root).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn rerun_if_changed(path: &Path) {
    // A path that does not exist would make cargo rerun this script on every build.
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let commit = git(&root, &["rev-parse", "HEAD"]);
    let dirty = git(&root, &["status", "--porcelain"]).map(|s| !s.is_empty());
    let value = match (commit, dirty) {
        (Some(c), Some(true)) => format!("{c}-dirty"),
        (Some(c), _) => c,
        (None, _) => "unknown".into(),
    };
    println!("cargo:rustc-env=LOWBIT_SOURCE_COMMIT={value}");

    // Fresh after a commit or checkout (HEAD, the branch ref, the index) and after any source edit (dirtiness).
    if let Some(git_dir) = git(&root, &["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) {
        rerun_if_changed(&git_dir.join("HEAD"));
        rerun_if_changed(&git_dir.join("index"));
        rerun_if_changed(&git_dir.join("packed-refs"));
        if let Some(head_ref) = git(&root, &["symbolic-ref", "-q", "HEAD"]) {
            rerun_if_changed(&git_dir.join(head_ref));
        }
    }
    for source in ["crates", "Cargo.toml", "Cargo.lock"] {
        rerun_if_changed(&root.join(source));
    }
}
