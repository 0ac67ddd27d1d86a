"""A stand-in for the Hugging Face Hub and Google Cloud Storage, on 127.0.0.1, for the handle tests.

It answers what `huggingface_hub.hf_hub_download` and `list_repo_files` ask (`/{repo}/resolve/
{revision}/{file}` with the X-Repo-Commit, ETag and X-Error-Code headers, byte ranges, and
`/api/models/{repo}/tree/{revision}`) and the anonymous object URLs of GCS (`/{bucket}/{object}`).
Uploads as `huggingface_hub.HfApi.create_repo` and `upload_folder` send them (every file inline
in the commit). Faults on demand: a response or a commit cut off halfway, a body that does not match
its hash.
"""

import base64
import contextlib
import hashlib
import http.server
import json
import ssl
import threading
import urllib.parse


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class StandIn:
    """Files served: `repos` {"org/name": {file: bytes}}, `buckets` {bucket: {object: bytes}}.

    `requests` logs (method, path) of every request. A path in `cut` gets half its body and then a
    closed connection, and every later request for it a 500, until it is removed from `cut`. A
    path in `corrupt` is served with its first byte changed but its headers (and hash) unchanged.
    """

    def __init__(self, tls=None):
        """`tls`: (certificate file, key file) to serve HTTPS instead of HTTP."""
        self.repos, self.buckets = {}, {}
        self.requests, self.cut, self.corrupt = [], set(), set()
        self.private, self.messages = {}, []  # of uploads: repo -> private flag; commit summaries
        self._was_cut = set()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        if tls:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        """Stops answering and frees the port: the server is gone."""
        self.server.shutdown()
        self.server.server_close()

    def gets(self, marker=""):
        """How many GETs of file bodies (Hub resolve or GCS object) contained `marker`."""
        return sum(1 for m, p in self.requests if m == "GET" and "/api/" not in p and marker in p)

    def commit(self, repo):
        return hashlib.sha1(repo.encode()).hexdigest()

    def post(self, path, body):
        """The JSON answer to an upload request: create a repo, pre-upload, commit."""
        parts = urllib.parse.unquote(path).strip("/").split("/")
        if parts[:3] == ["api", "repos", "create"]:
            request = json.loads(body)
            repo = "/".join(filter(None, [request.get("organization"), request["name"]]))
            self.repos.setdefault(repo, {})
            self.private[repo] = request.get("visibility") == "private" or bool(request.get("private"))
            return {"url": f"{self.url}/{repo}"}
        repo = "/".join(parts[2:-2])
        if parts[-2] == "preupload":
            files = json.loads(body)["files"]
            return {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        files = {v["value"]["path"]: base64.b64decode(v["value"]["content"]) for v in lines if v["key"] == "file"}
        self.repos[repo] = {**self.repos.get(repo, {}), **files}
        self.messages.append(next(v["value"]["summary"] for v in lines if v["key"] == "header"))
        return {"commitUrl": f"{self.url}/{repo}/commit/{self.commit(repo)}", "commitOid": self.commit(repo)}

    def lookup(self, path):
        """(status, headers, body) for a request path."""
        parts = urllib.parse.unquote(urllib.parse.urlsplit(path).path).strip("/").split("/")
        if parts[:2] == ["api", "models"] and "tree" in parts:
            i = parts.index("tree")
            repo = "/".join(parts[2:i])
            if repo not in self.repos:
                return 404, {"X-Error-Code": "RepoNotFound"}, b"{}"
            files = [{"type": "file", "path": n, "size": len(b), "oid": git_blob_sha1(b)}
                     for n, b in self.repos[repo].items()]
            return 200, {"Content-Type": "application/json"}, json.dumps(files).encode()
        if "resolve" in parts:
            i = parts.index("resolve")
            repo, revision, name = "/".join(parts[:i]), parts[i + 1], "/".join(parts[i + 2:])
            if repo not in self.repos:
                return 404, {"X-Error-Code": "RepoNotFound"}, b""
            if revision not in ("main", self.commit(repo)):
                return 404, {"X-Error-Code": "RevisionNotFound"}, b""
            commit = {"X-Repo-Commit": self.commit(repo)}
            if name not in self.repos[repo]:
                return 404, {"X-Error-Code": "EntryNotFound", **commit}, b""
            body = self.repos[repo][name]
            large = name.endswith((".safetensors", ".npz"))  # stored in LFS: the ETag is the sha256
            etag = hashlib.sha256(body).hexdigest() if large else git_blob_sha1(body)
            return 200, {**commit, "ETag": f'"{etag}"'}, body
        bucket, name = parts[0], "/".join(parts[1:])
        if bucket in self.buckets and name in self.buckets[bucket]:
            return 200, {}, self.buckets[bucket][name]
        return 404, {}, b"<Error><Code>NoSuchKey</Code></Error>"


def _handler(standin):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self._answer(send_body=False)

        def do_GET(self):
            self._answer(send_body=True)

        def do_POST(self):
            """Repo creation, the pre-upload check (every file inline) and commits, applied whole:
            a commit whose body is cut (a path in `cut`) changes nothing."""
            standin.requests.append((self.command, self.path))
            path = urllib.parse.urlsplit(self.path).path
            size = int(self.headers.get("Content-Length", 0))
            if any(c in path for c in standin.cut):
                self.rfile.read(size // 2)
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(2)
                return
            body = self.rfile.read(size)
            answer = standin.post(path, body)
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _answer(self, send_body):
            standin.requests.append((self.command, self.path))
            status, headers, body = standin.lookup(self.path)
            key = urllib.parse.urlsplit(self.path).path
            if send_body and any(c in key for c in standin.cut):
                return self._cut(body, key)
            if any(c in key for c in standin.corrupt) and body:
                body = bytes([body[0] ^ 0xFF]) + body[1:]
            start = self._range_start() if status == 200 and send_body else 0
            if start:
                status, body = 206, body[start:]
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def _range_start(self):
            value = self.headers.get("Range", "")
            if value.startswith("bytes=") and value[6:].split("-")[0].isdigit():
                return int(value[6:].split("-")[0])
            return 0

        def _cut(self, body, key):
            if key in standin._was_cut:
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            standin._was_cut.add(key)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(2)

    return Handler
