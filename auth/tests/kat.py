#!/usr/bin/env python3
"""Known-answer vectors for nvmfd-auth, computed independently of the Rust code.

Written from the Linux kernel's algorithm (drivers/nvme/common/auth.c: nvme_auth_transform_key,
nvme_auth_augmented_challenge; drivers/nvme/target/auth.c: nvmet_auth_host_hash,
nvmet_auth_ctrl_hash; struct nvmf_auth_dhchap_*_data in include/linux/nvme.h) with Python's
hashlib/hmac/base64/zlib and built-in modular exponentiation only.

It also re-derives the RFC 7919 primes from their definition and checks the hex in src/dh.rs.

    python3 auth/tests/kat.py > auth/tests/vectors.txt
"""
import base64
import hashlib
import hmac
import os
import re
import struct
import zlib

HASHES = {1: hashlib.sha256, 2: hashlib.sha384, 3: hashlib.sha512}
# RFC 7919 Appendix A: p = 2^b - 2^{b-64} + {[2^{b-130} e] + X} * 2^64 - 1.
RFC7919_X = {1: (2048, 560316), 2: (3072, 2625351), 3: (4096, 5736041),
             4: (6144, 15705020), 5: (8192, 10965728)}


def floor_e_scaled(n):
    """floor(2^n * e), from e = sum 1/k! with 128 guard bits."""
    guard = 128
    scale = 1 << (n + guard)
    total, fact, k = 0, 1, 0
    while scale // fact:
        total += scale // fact
        k += 1
        fact *= k
    return total >> guard


def rfc7919_prime(group):
    b, x = RFC7919_X[group]
    return (1 << b) - (1 << (b - 64)) + (floor_e_scaled(b - 130) + x) * (1 << 64) - 1


def check_dh_rs():
    src = open(os.path.join(os.path.dirname(__file__), "..", "src", "dh.rs")).read()
    for group, (bits, _) in RFC7919_X.items():
        m = re.search(r"const FFDHE%d_P: &str = concat!\((.*?)\);" % bits, src, re.S)
        assert m, "FFDHE%d_P missing" % bits
        hexstr = "".join(re.findall(r'"([0-9A-F]+)"', m.group(1)))
        assert int(hexstr, 16) == rfc7919_prime(group), "FFDHE%d_P differs from RFC 7919" % bits


def det(label, n):
    """Deterministic test bytes."""
    out = b""
    i = 0
    while len(out) < n:
        out += hashlib.sha512(b"%s/%d" % (label.encode(), i)).digest()
        i += 1
    return out[:n]


def interchange(hh, secret):
    crc = zlib.crc32(secret) & 0xFFFFFFFF
    return "DHHC-1:%02x:%s:" % (hh, base64.b64encode(secret + struct.pack("<I", crc)).decode())


def transform(hh, secret, nqn):
    if hh == 0:
        return secret
    return hmac.new(secret, nqn.encode() + b"NVMe-over-Fabrics", HASHES[hh]).digest()


def augment(hid, skey, challenge):
    hashed = HASHES[hid](skey).digest()
    return hmac.new(hashed, challenge, HASHES[hid]).digest()


def host_resp(hid, key, chal, s1, tid, sc_c, hostnqn, subsysnqn):
    data = chal + struct.pack("<I", s1) + struct.pack("<H", tid) + bytes([sc_c])
    data += b"HostHost" + hostnqn.encode() + b"\0" + subsysnqn.encode()
    return hmac.new(key, data, HASHES[hid]).digest()


def ctrl_resp(hid, key, chal, s2, tid, hostnqn, subsysnqn):
    data = chal + struct.pack("<I", s2) + struct.pack("<H", tid) + b"\0"
    data += b"Controller" + subsysnqn.encode() + b"\0" + hostnqn.encode()
    return hmac.new(key, data, HASHES[hid]).digest()


def case(name, hid, group, host_hh, ctrl_hh, secret_len):
    hostnqn = "nqn.2014-08.org.nvmexpress:uuid:%s" % det(name + "uuid", 8).hex()
    subsysnqn = "nqn.2026-12.io.nvmfd:kat-%s" % name
    hl = HASHES[hid]().digest_size
    host_secret = det(name + "host", secret_len)
    ctrl_secret = det(name + "ctrl", secret_len)
    c1, c2 = det(name + "c1", hl), det(name + "c2", hl)
    s1 = int.from_bytes(det(name + "s1", 4), "little") | 1
    s2 = int.from_bytes(det(name + "s2", 4), "little") | 1
    tid = int.from_bytes(det(name + "tid", 2), "little")
    v = {"hash": "%d" % hid, "dhgroup": "%d" % group, "hostnqn": hostnqn, "subsysnqn": subsysnqn,
         "host_key": interchange(host_hh, host_secret), "ctrl_key": interchange(ctrl_hh, ctrl_secret),
         "c1": c1.hex(), "c2": c2.hex(), "s1": "%d" % s1, "s2": "%d" % s2, "tid": "%d" % tid}
    kh = transform(host_hh, host_secret, hostnqn)
    kc = transform(ctrl_hh, ctrl_secret, subsysnqn)
    v["host_key_transformed"] = kh.hex()
    v["ctrl_key_transformed"] = kc.hex()
    ctrl_pub = host_pub = b""
    a1, a2 = c1, c2
    if group:
        p = rfc7919_prime(group)
        size = RFC7919_X[group][0] // 8
        x = det(name + "ctrlpriv", 40)
        y = det(name + "hostpriv", 40)
        ctrl_pub = pow(2, int.from_bytes(x, "big"), p).to_bytes(size, "big")
        host_pub = pow(2, int.from_bytes(y, "big"), p).to_bytes(size, "big")
        shared = pow(int.from_bytes(host_pub, "big"), int.from_bytes(x, "big"), p).to_bytes(size, "big")
        assert shared == pow(int.from_bytes(ctrl_pub, "big"), int.from_bytes(y, "big"), p).to_bytes(size, "big")
        a1, a2 = augment(hid, shared, c1), augment(hid, shared, c2)
        v.update(ctrl_priv=x.hex(), host_priv=y.hex(), shared=shared.hex(),
                 c1_augmented=a1.hex(), c2_augmented=a2.hex())
    v["ctrl_pub"] = ctrl_pub.hex()
    v["host_pub"] = host_pub.hex()
    r1 = host_resp(hid, kh, a1, s1, tid, 0, hostnqn, subsysnqn)
    r2 = ctrl_resp(hid, kc, a2, s2, tid, hostnqn, subsysnqn)
    v["r1"], v["r2"] = r1.hex(), r2.hex()
    # struct nvmf_auth_dhchap_challenge_data / _reply_data / _success1_data
    v["challenge_msg"] = (struct.pack("<BBHHBBBBHI", 1, 1, 0, tid, hl, 0, hid, group,
                                      len(ctrl_pub), s1) + c1 + ctrl_pub).hex()
    v["reply_msg"] = (struct.pack("<BBHHBBBBHI", 1, 2, 0, tid, hl, 0, 1, 0, len(host_pub), s2)
                      + r1 + c2 + host_pub).hex()
    v["success1_msg"] = (struct.pack("<BBHHBBB7x", 1, 3, 0, tid, hl, 0, 1) + r2).hex()
    return name, v


def main():
    check_dh_rs()
    cases = [
        case("sha256-null", 1, 0, 0, 0, 32),
        case("sha384-null-t2", 2, 0, 2, 2, 48),
        case("sha512-null-t3", 3, 0, 3, 3, 64),
        case("sha256-ffdhe2048-t1", 1, 1, 1, 1, 32),
        case("sha512-ffdhe3072-t0", 3, 2, 0, 0, 48),
        case("sha384-ffdhe8192-t2", 2, 5, 2, 2, 48),
        # A secret length that differs from its transformation hash (allowed since Linux 6.7).
        case("sha256-ffdhe2048-t3-32", 1, 1, 3, 2, 32),
    ]
    print("# Generated by auth/tests/kat.py; do not edit.")
    for name, v in cases:
        print("case %s" % name)
        for k, val in v.items():
            print("%s %s" % (k, val))
        print()


main()
