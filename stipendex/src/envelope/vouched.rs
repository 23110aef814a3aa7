//! What one side signed itself, remembered for a while: a JWS it made that comes back inside
//! another (a receiver's Quote inside the Proof that pays it) is read without checking its
//! signature a second time.
//!
//! The memo holds the SHA-256 of each compact JWS, at most [`Vouched::new`]'s bound of them,
//! the oldest forgotten first. A JWS it does not hold (forgotten, signed by another instance, or
//! never signed here) is verified as [`Signed::parse`] does: forgetting costs a verification,
//! never a wrong answer. Only the side's own signing adds to it, never input from the network,
//! so a flood of requests can only make it forget sooner.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use sha2::{Digest as _, Sha256};

use super::{Object, Signed};
use crate::Error;

/// JWSs this side signed, by SHA-256, bounded.
pub(crate) struct Vouched {
    memo: Mutex<Memo>,
    bound: usize,
}

#[derive(Default)]
struct Memo {
    known: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

fn hash(compact: &str) -> [u8; 32] {
    Sha256::digest(compact.trim().as_bytes()).into()
}

impl Vouched {
    /// A memo of at most `bound` JWSs.
    pub(crate) fn new(bound: usize) -> Self {
        Vouched {
            memo: Mutex::new(Memo::default()),
            bound: bound.max(1),
        }
    }

    /// Remembers `signed`, which this side made.
    pub(crate) fn vouch<T: Object>(&self, signed: &Signed<T>) {
        let h = hash(signed.jws());
        let mut m = self
            .memo
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !m.known.insert(h) {
            return;
        }
        m.order.push_back(h);
        while m.order.len() > self.bound {
            if let Some(old) = m.order.pop_front() {
                m.known.remove(&old);
            }
        }
    }

    /// [`Signed::parse`] of `compact`, its signature checked only if this side did not sign it
    /// (or has forgotten it).
    ///
    /// # Errors
    /// As [`Signed::parse`].
    pub(crate) fn parse<T: Object>(&self, compact: &str) -> Result<Signed<T>, Error> {
        let h = hash(compact);
        let known = self
            .memo
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .known
            .contains(&h);
        if known {
            Signed::reread_vouched(compact)
        } else {
            Signed::parse(compact)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{Mandate, Party, SecretKey};

    /// A signed object of `key`'s (the memo takes any: the receiver's are Quotes, whose
    /// altered copy inside a Proof is refused in the layer tests).
    fn signed(key: &SecretKey) -> Signed<Mandate> {
        let principal = Party {
            id: "p".into(),
            key: key.public(),
        };
        let m = Mandate::draft(principal, SecretKey::generate().public(), 900, 100);
        Signed::sign(m, key).unwrap()
    }

    #[test]
    fn a_jws_signed_here_is_read_again_and_a_forged_one_is_still_refused() {
        let key = SecretKey::generate();
        let memo = Vouched::new(2);
        let a = signed(&key);
        memo.vouch(&a);
        assert_eq!(memo.parse::<Mandate>(a.jws()).unwrap().jws(), a.jws());
        // Not signed here: verified, so a bad signature is refused.
        let b = signed(&key);
        let mut forged = b.jws().to_owned();
        let last = forged.pop().unwrap();
        forged.push(if last == 'A' { 'B' } else { 'A' });
        assert!(memo.parse::<Mandate>(&forged).is_err());
        assert!(memo.parse::<Mandate>(b.jws()).is_ok());
    }

    #[test]
    fn the_memo_forgets_the_oldest_beyond_its_bound() {
        let key = SecretKey::generate();
        let memo = Vouched::new(2);
        let all: Vec<_> = (0..3).map(|_| signed(&key)).collect();
        for s in &all {
            memo.vouch(s);
        }
        let m = memo.memo.lock().unwrap();
        assert_eq!(m.known.len(), 2);
        assert!(!m.known.contains(&hash(all[0].jws())));
        assert!(m.known.contains(&hash(all[2].jws())));
    }
}
