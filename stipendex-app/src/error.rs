//! What went wrong, as one sentence for a human: the error of the command line and of what it
//! shares with the test runner.

/// What went wrong, as one sentence for a human (the `stipendex` command's `CliError`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A plain message.
    #[error("{0}")]
    Msg(String),
    /// The library's refusal.
    #[error("{0}")]
    Stipendex(Box<stipendex::Error>),
}

impl From<stipendex::Error> for Error {
    fn from(e: stipendex::Error) -> Self {
        Error::Stipendex(Box::new(e))
    }
}

/// An [`Error`] saying `s`: one sentence for a human.
pub fn msg(s: impl Into<String>) -> Error {
    Error::Msg(s.into())
}
