package node

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
	"unicode"
)

// FuzzParseLiveRequest: whatever a peer sends as its request line, the
// parser does not panic, and what it accepts is exactly one protocol line
// naming a valid namespace and name (no spaces, slashes or control bytes
// that could reach a log, a path or an API request unchecked).
func FuzzParseLiveRequest(f *testing.F) {
	for _, seed := range []string{
		"KAIRON-LIVE/1 default live", "KAIRON-LIVE/1 ns-1 move.live-2", "KAIRON-LIVE/1 default",
		"KAIRON-LIVE/1  default live", "KAIRON-LIVE/1 default live extra", "KAIRON-LIVE/2 default live",
		"kairon-live/1 default live", "KAIRON-LIVE/1 ../etc passwd", "KAIRON-LIVE/1 default live\r",
		"KAIRON-LIVE/1 Default live", "KAIRON-LIVE/1 default a/b", "", " ", "KAIRON-LIVE/1",
		"KAIRON-LIVE/1 default " + strings.Repeat("a", 254), "KAIRON-LIVE/1 " + strings.Repeat("n", 64) + " live",
		"KAIRON-LIVE/1 default\tlive", "KAIRON-LIVE/1 default l\x00ve", "KAIRON-LIVE/1 défault live",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		key, err := parseLiveRequest(line)
		if err != nil {
			if key.Namespace != "" || key.Name != "" {
				t.Fatalf("%q: error %v with a key %v", line, err, key)
			}
			if len(line) >= 16 && strings.Contains(err.Error(), line) {
				t.Fatalf("%q: the refusal echoes the request: %v", line, err)
			}
			return
		}
		if got := liveProtocol + " " + key.Namespace + " " + key.Name; got != line {
			t.Fatalf("%q accepted as %v, which reads back as %q", line, key, got)
		}
		if key.Namespace == "" || key.Name == "" || len(key.Namespace) > 63 || len(key.Name) > 253 {
			t.Fatalf("%q accepted with namespace %q name %q", line, key.Namespace, key.Name)
		}
		for _, r := range key.Namespace + key.Name {
			if !(r == '-' || r == '.' || unicode.IsDigit(r) || (r >= 'a' && r <= 'z')) {
				t.Fatalf("%q accepted with byte %q in the key %v", line, r, key)
			}
		}
		if len(line) > liveLineLimit {
			t.Fatalf("%q accepted, longer than a protocol line may be", line)
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
