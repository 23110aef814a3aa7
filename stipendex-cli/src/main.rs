//! The `stipendex` binary: the command line lives in the library ([`stipendex_cli::main`]).

/// mimalloc rather than the system allocator: a paid call allocates and frees across the
/// runtime's threads and the SQLite writers', where glibc's malloc and free took about an
/// eighth of the process's CPU at 64 clients (docs/performance.md). A choice of the binary
/// only; the libraries leave it to theirs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    stipendex_cli::main()
}
