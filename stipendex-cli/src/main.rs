//! The `stipendex` binary: the command line lives in the library ([`stipendex_cli::main`]).

fn main() -> std::process::ExitCode {
    stipendex_cli::main()
}
