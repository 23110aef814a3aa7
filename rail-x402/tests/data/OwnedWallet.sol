// SPDX-License-Identifier: MIT
// A minimal ERC-1271 smart wallet for rail-x402's contract-signer tests: a signature is valid
// when it is the owner's 65-byte ECDSA signature (r, s, v) of the hash, with low s.
// Compiled by scripts/x402/compile-wallet.sh (solc-js 0.8.26 from npm); the output is
// tests/data/OwnedWallet.bin (creation code, hex), committed with this source.
pragma solidity 0.8.26;

contract OwnedWallet {
    address public immutable owner;

    constructor(address owner_) {
        owner = owner_;
    }

    function isValidSignature(bytes32 hash, bytes calldata signature) external view returns (bytes4) {
        if (signature.length != 65) return 0xffffffff;
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        if (uint256(s) > 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0) return 0xffffffff;
        address signer = ecrecover(hash, v, r, s);
        return (signer != address(0) && signer == owner) ? bytes4(0x1626ba7e) : bytes4(0xffffffff);
    }
}
