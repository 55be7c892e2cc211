//! `solocron completions SHELL` and `solocron man`: generated from the same clap definition
//! the commands are parsed with, so they can never list a command or flag that is not there.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::Failure;

/// `solocron completions`'s arguments.
#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

/// Prints the completion script of `C` for the shell.
pub fn completions<C: CommandFactory>(a: CompletionsArgs) -> Result<(), Failure> {
    let mut cmd = C::command();
    let name = cmd.get_name().to_owned();
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, name, &mut out);
    write_stdout(&out)
}

/// `solocron man`'s arguments.
#[derive(Args)]
pub struct ManArgs {
    /// Write every page (solocron.1, and solocron-run.1 and so on for each command, with
    /// its options) into this directory instead of printing solocron.1.
    #[arg(long, value_name = "DIR")]
    dir: Option<std::path::PathBuf>,
}

/// Prints the man page of `C` in roff; with `--dir`, writes it and one page per command.
pub fn man<C: CommandFactory>(a: ManArgs) -> Result<(), Failure> {
    let Some(dir) = a.dir else {
        let mut out = Vec::new();
        clap_mangen::Man::new(C::command()).render(&mut out).map_err(|e| Failure(1, format!("man page: {e}")))?;
        return write_stdout(&out);
    };
    clap_mangen::generate_to(C::command(), &dir).map_err(|e| Failure(1, format!("{}: {e}", dir.display())))?;
    crate::output::line(format_args!("wrote the man pages to {}", dir.display()))
}

/// Through [`crate::output::emit`]: a reader that closed the pipe ends the command quietly.
fn write_stdout(bytes: &[u8]) -> Result<(), Failure> {
    crate::output::emit(bytes)
}
