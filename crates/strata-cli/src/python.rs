//! `strata run pipeline.py`: a pipeline written in Python (Lakeflow's Python API) runs in
//! the Python package (`python -m strata run`), which embeds the same engine; the CLI only
//! hands it the arguments. `STRATA_PYTHON` names the interpreter (default `python3`).

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, ExitCode};

/// Is `pipeline` a Python file?
pub fn is_python(pipeline: &Path) -> bool {
    pipeline.extension().is_some_and(|e| e == "py")
}

/// Runs `python -m strata run ARGS...` and exits as it does (its exit codes are the CLI's).
pub fn delegate(args: Vec<OsString>) -> ExitCode {
    let python = std::env::var_os("STRATA_PYTHON").unwrap_or_else(|| "python3".into());
    let shown = Path::new(&python).display().to_string();
    let check = Command::new(&python)
        .args(["-c", "import strata._native"])
        .output();
    match check {
        Err(e) => {
            eprintln!(
                "error: a Python pipeline needs Python with the strata package, and {shown} \
                 cannot be started: {e} (set STRATA_PYTHON to the interpreter; install the \
                 package with pip install ./python, see docs/python.md)"
            );
            return ExitCode::from(2);
        }
        Ok(out) if !out.status.success() => {
            let why = String::from_utf8_lossy(&out.stderr);
            let why = why.lines().last().unwrap_or("").trim();
            eprintln!(
                "error: a Python pipeline needs the strata Python package, which {shown} \
                 cannot import ({why}); install it with pip install ./python (docs/python.md), \
                 or set STRATA_PYTHON to an interpreter that has it"
            );
            return ExitCode::from(2);
        }
        Ok(_) => {}
    }
    match Command::new(&python)
        .args(["-m", "strata", "run"])
        .args(args)
        .status()
    {
        Ok(status) => ExitCode::from(status.code().unwrap_or(5).clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("error: cannot start {shown}: {e}");
            ExitCode::from(2)
        }
    }
}
