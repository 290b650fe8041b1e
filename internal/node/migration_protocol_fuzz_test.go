package node

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
	"unicode"
)

// FuzzParseMigrationRequest: whatever a peer sends as its request line, the
// parser does not panic, and what it accepts is exactly one protocol line
// naming a known protocol, a valid namespace and name and a token of the
// right syntax (no spaces, slashes or control bytes that could reach a log,
// a path or an API request unchecked).
func FuzzParseMigrationRequest(f *testing.F) {
	tok := strings.Repeat("A", transferTokenLen)
	for _, seed := range []string{
		"KAIRON-LIVE/2 default live " + tok, "KAIRON-STATE/1 ns-1 move.cold-2 " + tok, "KAIRON-LIVE/2 default live",
		"KAIRON-LIVE/2  default live " + tok, "KAIRON-LIVE/2 default live " + tok + " extra", "KAIRON-LIVE/1 default live " + tok,
		"kairon-live/2 default live " + tok, "KAIRON-STATE/1 ../etc passwd " + tok, "KAIRON-LIVE/2 default live " + tok + "\r",
		"KAIRON-LIVE/2 Default live " + tok, "KAIRON-STATE/1 default a/b " + tok, "", " ", "KAIRON-LIVE/2",
		"KAIRON-LIVE/2 default " + strings.Repeat("a", 254) + " " + tok, "KAIRON-LIVE/2 " + strings.Repeat("n", 64) + " live " + tok,
		"KAIRON-LIVE/2 default\tlive " + tok, "KAIRON-LIVE/2 default l\x00ve " + tok, "KAIRON-LIVE/2 défault live " + tok,
		"KAIRON-STATE/1 default cold " + tok[1:], "KAIRON-STATE/1 default cold " + tok + "A", "KAIRON-STATE/1 default cold " + tok[1:] + "=",
		"KAIRON-STATE/1 default cold " + tok[1:] + "/", "KAIRON-STATE/1 default cold " + tok[1:] + "+",
		"KAIRON-SNAPSHOT/1 default nightly-web-1-20261203-0300 " + tok, "KAIRON-SNAPSHOT/2 default snap " + tok,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		req, err := parseMigrationRequest(line)
		if err != nil {
			if req != (migrationRequest{}) {
				t.Fatalf("%q: error %v with a request %+v", line, err, req)
			}
			if len(line) >= 16 && strings.Contains(err.Error(), line) {
				t.Fatalf("%q: the refusal echoes the request: %v", line, err)
			}
			return
		}
		if req.protocol != liveProtocol && req.protocol != stateProtocol && req.protocol != snapshotProtocol {
			t.Fatalf("%q accepted with protocol %q", line, req.protocol)
		}
		if got := req.protocol + " " + req.key.Namespace + " " + req.key.Name + " " + req.token; got != line {
			t.Fatalf("%q accepted as %+v, which reads back as %q", line, req, got)
		}
		if req.key.Namespace == "" || req.key.Name == "" || len(req.key.Namespace) > 63 || len(req.key.Name) > 253 {
			t.Fatalf("%q accepted with namespace %q name %q", line, req.key.Namespace, req.key.Name)
		}
		for _, r := range req.key.Namespace + req.key.Name {
			if !(r == '-' || r == '.' || unicode.IsDigit(r) || (r >= 'a' && r <= 'z')) {
				t.Fatalf("%q accepted with byte %q in the key %v", line, r, req.key)
			}
		}
		if len(req.token) != transferTokenLen {
			t.Fatalf("%q accepted with a token of %d bytes", line, len(req.token))
		}
		for _, r := range req.token {
			if !(r == '-' || r == '_' || unicode.IsDigit(r) || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')) {
				t.Fatalf("%q accepted with byte %q in the token", line, r)
			}
		}
		if len(line) > liveLineLimit {
			t.Fatalf("%q accepted, longer than a protocol line may be", line)
		}
	})
}

// FuzzParseStateAnswer: whatever a source answers a state request, the
// target does not panic, accepts only "OK <non-negative size>", and quotes
// a refusal only sanitized.
func FuzzParseStateAnswer(f *testing.F) {
	for _, seed := range []string{"OK 0", "OK 4096", "OK -1", "OK ", "OK 99999999999999999999", "ERR refused", "ERR \x1b[2Jboom", "", "OK 1 2", "OK +5", "OK 0x10"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, answer string) {
		size, err := parseStateAnswer(answer)
		if err != nil {
			if size != 0 {
				t.Fatalf("%q: error %v with size %d", answer, err, size)
			}
			for _, r := range err.Error() {
				if r != '\n' && r != '\t' && (r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f)) {
					t.Fatalf("%q: refusal %q holds control character %U", answer, err, r)
				}
			}
			return
		}
		if size < 0 || !strings.HasPrefix(answer, "OK ") {
			t.Fatalf("%q accepted with size %d", answer, size)
		}
	})
}

// FuzzReadLine: a peer's bytes never make readLine panic, return a line
// longer than liveLineLimit or holding a newline, or read past the first
// newline (the backend stream that follows stays intact).
func FuzzReadLine(f *testing.F) {
	for _, seed := range []string{
		"OK\n", "ERR refused\n", "DONE\nstream", "KAIRON-LIVE/1 default live\n\x00\x01stream", "", "no newline",
		strings.Repeat("x", liveLineLimit) + "\n", strings.Repeat("x", liveLineLimit+1) + "\n", "\n\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(data), 16)
		line, err := readLine(r)
		nl := bytes.IndexByte(data, '\n')
		switch {
		case err != nil:
			if nl >= 0 && nl <= liveLineLimit {
				t.Fatalf("a line of %d bytes refused: %v", nl, err)
			}
			if line != "" {
				t.Fatalf("error %v with a line %q", err, line)
			}
		case nl < 0:
			t.Fatalf("a line %q without a newline in the input", line)
		case len(line) > liveLineLimit || strings.Contains(line, "\n"):
			t.Fatalf("line of %d bytes (%q)", len(line), line)
		case line != string(data[:nl]):
			t.Fatalf("line %q, want %q", line, data[:nl])
		default:
			rest := new(bytes.Buffer)
			_, _ = rest.ReadFrom(r)
			if !bytes.Equal(rest.Bytes(), data[nl+1:]) {
				t.Fatalf("after the line, %q left, want %q", rest.Bytes(), data[nl+1:])
			}
		}
	})
}
