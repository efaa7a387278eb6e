"""A strict CloudEvents receiver for the relay e2e test (tests/e2e/relay.rs).

Every request is parsed with the official CloudEvents SDK for Python (PyPI `cloudevents`,
`cloudevents.core.bindings.http.from_http`: binary or structured mode, as the request says;
a batch, `application/cloudevents-batch+json`, is split and each element parsed as a
structured event). The SDK checks required attributes and extension names but not value
ranges, so each attribute is then checked against the CloudEvents type system as well:
String, Boolean, URI, Timestamp or an Integer within signed 32 bits. A request with an
invalid event is answered 400 and the reason is appended to the --invalid file; valid events
are appended to --out as JSON lines. The first request is answered 503 (the relay must
retry), a bad HMAC signature 401.

Usage: python cloudevents_receiver.py --secret-file F --out F --invalid F
Prints "listening on http://127.0.0.1:PORT/events" once ready.
"""

import argparse
import datetime
import hashlib
import hmac
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat

INT32 = range(-(2**31), 2**31)
STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"


def type_errors(attributes):
    """Attributes whose value has no CloudEvents type (e.g. an Integer beyond 32 bits)."""
    errors = []
    for name, value in attributes.items():
        if isinstance(value, bool) or isinstance(value, str) or isinstance(value, datetime.datetime):
            continue
        if isinstance(value, int) and value in INT32:
            continue
        errors.append(f"attribute {name}={value!r} is not a CloudEvents type (Integer is signed 32-bit)")
    return errors


def parse(headers, body):
    """The events of one request, as (attributes, data); raises ValueError when invalid."""
    content_type = headers.get("content-type", "")
    if content_type.startswith(BATCH):
        items = json.loads(body)
        if not isinstance(items, list):
            raise ValueError("a batch is not a JSON array")
        messages = [HTTPMessage({"content-type": STRUCTURED}, json.dumps(i).encode()) for i in items]
    else:
        messages = [HTTPMessage(headers, body)]
    events = []
    for m in messages:
        try:
            event = from_http(m, JSONFormat())
        except Exception as e:  # the SDK's validation errors have no common base
            raise ValueError(f"the CloudEvents SDK refused the event: {type(e).__name__}: {e}") from e
        attributes = event.get_attributes()
        errors = type_errors(attributes)
        if errors:
            raise ValueError("; ".join(errors))
        events.append((attributes, event.get_data()))
    return events


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--invalid", required=True)
    args = ap.parse_args()
    with open(args.secret_file, "rb") as f:
        secret = f.read().rstrip(b"\n")
    lock = threading.Lock()
    state = {"first": True}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):
            sys.stderr.write("receiver: " + (fmt % a) + "\n")

        def answer(self, status, text=""):
            body = text.encode()
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with lock:
                if state["first"]:
                    state["first"] = False
                    return self.answer(503, "the first request is refused: retry")
            want = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
            if not hmac.compare_digest(want, self.headers.get("x-fleetwatch-signature", "")):
                return self.answer(401, "bad signature")
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                events = parse(headers, body)
            except ValueError as e:
                with lock, open(args.invalid, "a") as f:
                    f.write(json.dumps({"error": str(e), "body": body.decode("utf-8", "replace")}) + "\n")
                return self.answer(400, str(e))
            with lock, open(args.out, "a") as f:
                for attributes, data in events:
                    line = {k: (v.isoformat() if isinstance(v, datetime.datetime) else v) for k, v in attributes.items()}
                    line["data"] = data
                    f.write(json.dumps(line) + "\n")
            return self.answer(200)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}/events", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
