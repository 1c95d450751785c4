#!/usr/bin/env python3
"""Writes the seed corpus in Fuzz/corpus/<target>/ from the unit tests' vectors (the codec's
requests, chunked bodies and upstream heads, the configuration tests' YAML), the shipped
configuration files, and a few hand-written targets. Files are named by their SHA-1, as
libFuzzer names what it adds, so running this again adds nothing twice.

Usage: Fuzz/seeds.py (from anywhere)."""
import hashlib
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "Fuzz", "corpus")

LITERAL = re.compile(r'"""\n(.*?)\n([ \t]*)"""|"((?:[^"\\\n]|\\.)*)"', re.S)
CONCAT = re.compile(r'^\s*\+\s*$', re.S)


def unescape(text):
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        n = text[i + 1]
        if n == "u":
            end = text.index("}", i)
            out.append(chr(int(text[i + 3:end], 16)))
            i = end + 1
            continue
        if n == "\n":  # a multi-line literal's line continuation
            i += 2
            continue
        out.append({"r": "\r", "n": "\n", "t": "\t", "0": "\0", '"': '"', "\\": "\\", "'": "'"}[n])
        i += 2
    return "".join(out)


def literals(path):
    """The file's string literals without interpolation, adjacent `"a" + "b"` joined."""
    source = open(os.path.join(ROOT, path)).read()
    found = []  # (start, end, value or None)
    for m in LITERAL.finditer(source):
        if m.group(1) is not None:
            indent = m.group(2)
            body = "\n".join(line[len(indent):] if line.startswith(indent) else line.lstrip()
                             for line in m.group(1).split("\n"))
        else:
            body = m.group(3)
        value = None if "\\(" in body else unescape(body)
        found.append([m.start(), m.end(), value])
    joined = []
    for start, end, value in found:
        if joined and CONCAT.match(source[joined[-1][1]:start]):
            prev = joined[-1]
            prev[1] = end
            prev[2] = None if prev[2] is None or value is None else prev[2] + value
        else:
            joined.append([start, end, value])
    return [v for _, _, v in joined if v]


def write(target, data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    directory = os.path.join(CORPUS, target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


METHOD = re.compile(r"^\r?\n?[A-Z(]+ ")
CHUNKED_HEAD = "Transfer-Encoding: chunked\r\n\r\n"


def request_vectors():
    out = []
    for path in ["Tests/SluiceServerTests/HTTPRequestParserTests.swift"]:
        out += [v for v in literals(path) if METHOD.match(v)]
    return out


def main():
    requests = request_vectors()
    for v in requests:
        write("request-head", v)
        # Targets of every request line, each form behind its selector byte.
        line = v.lstrip("\r\n").split("\r\n", 1)[0].split(" ")
        if len(line) >= 2:
            write("request-target", b"\x01" + line[1].encode())
            write("request-target", b"\x02" + line[1].encode())
    # Chunked bodies: what follows a chunked head in the vectors, behind a limit selector.
    for v in requests:
        if CHUNKED_HEAD in v:
            write("chunked-body", b"\x00" + v.split(CHUNKED_HEAD, 1)[1].encode())
    for size in ["", "g", "-1", " 5", "0x5", "11111111111111111"]:
        write("chunked-body", b"\x00" + (size + "\r\nhello\r\n0\r\n\r\n").encode())
    for body in ["5\r\nhelloXX0\r\n\r\n", "5\rhello\r\n0\r\n\r\n", "8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n",
                 "5;name=value\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n", "0\r\n\r\n",
                 "3 ;x\r\nabc\r\n0\r\nA: b\r\nC: d\r\n\r\nGET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n"]:
        for selector in (0, 3, 4):
            write("chunked-body", bytes([selector]) + body.encode())
    # Upstream heads: each array of lines in the encoder's tests, for two client kinds.
    source = open(os.path.join(ROOT, "Tests/SluiceServerTests/ResponseEncoderTests.swift")).read()
    for array in re.findall(r'\[("HTTP/[^\]]*)\]', source):
        lines = [unescape(s) for s in re.findall(r'"((?:[^"\\]|\\.)*)"', array)]
        head = "".join(line + "\r\n" for line in lines) + "\r\n"
        write("response-head", b"\x06" + head.encode())
        write("response-head", b"\x01" + head.encode())
    write("response-head", b"\x06HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nX: a\r\n folded\r\nContent-Length: 0\r\n\r\n")
    for t in ["example.com:443", "[::1]:8443", "10.0.0.1:22", "a:0", "[fe80::1%25eth0]:443", "a.b_c-d:65535"]:
        write("request-target", b"\x00" + t.encode())
    for t in ["HTTP://Example.com:8080/p?q#f", "https://[2001:db8::1]/", "http://u@h/", "http://h:/x", "ftp://h/",
              "*", "/origin", "https://h:65536/", "http://h?x", "http://h"]:
        write("request-target", b"\x01" + t.encode())
        write("request-target", b"\x1a" + t.encode())
        write("request-target", b"\x22" + t.encode())
    # Configurations: the shipped files and every YAML literal of the configuration tests.
    for path in ["config/default.yaml", "config/sluice.yaml", "docker/sluice.yaml"]:
        write("config", open(os.path.join(ROOT, path), "rb").read())
    for path in ["Tests/SluiceConfigTests/ConfigLoaderTests.swift", "Tests/SluiceConfigTests/AdminConfigTests.swift",
                 "Tests/SluiceConfigTests/TrustConfigTests.swift"]:
        for v in literals(path):
            if ":" in v and len(v) > 6:
                write("config", v)


if __name__ == "__main__":
    main()
