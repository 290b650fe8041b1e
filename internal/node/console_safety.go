package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// What the console and saved-state server trusts of a request, and what
// guest text may reach an API object (issue 10, findings 3 and 6).

// maxTailLines bounds ?tail=N of the console.
const maxTailLines = 10000

// requestNames returns the {namespace} and {name} of a request after
// checking them: a namespace must be a DNS-1123 label and a name a DNS-1123
// subdomain, as Kubernetes requires, so neither can be "..", hold a slash
// or anything else that would lead filepath.Join out of the state
// directory. The escaped path is checked too: an encoded slash or backslash
// is refused before the mux's decoding can make it a path. On a bad name it
// answers 400 and returns ok false.
func requestNames(w http.ResponseWriter, r *http.Request) (namespace, name string, ok bool) {
	raw := strings.ToLower(r.URL.EscapedPath())
	if r.URL.RawPath != "" {
		raw += strings.ToLower(r.URL.RawPath)
	}
	if strings.Contains(raw, "%2f") || strings.Contains(raw, "%5c") || strings.Contains(raw, "%2e") || strings.Contains(raw, "%00") {
		http.Error(w, "bad path: encoded separator", http.StatusBadRequest)
		return "", "", false
	}
	namespace, name = r.PathValue("namespace"), r.PathValue("name")
	if len(validation.IsDNS1123Label(namespace)) > 0 {
		http.Error(w, "bad namespace", http.StatusBadRequest)
		return "", "", false
	}
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		http.Error(w, "bad name", http.StatusBadRequest)
		return "", "", false
	}
	return namespace, name, true
}

// seekToLastLines positions file at the start of its last n lines (a last
// line need not end in a newline), reading backwards from the end in
// blocks: memory stays one block whatever the file's size.
func seekToLastLines(file io.ReadSeeker, n int) error {
	size, err := file.Seek(0, io.SeekEnd)
	if err != nil || n <= 0 {
		return err
	}
	const block = 64 * 1024
	buf := make([]byte, block)
	end := size
	start := int64(0)
	newlines := 0
	skipLast := true // a newline ending the file ends the last line, it starts none
scan:
	for end > 0 {
		off := end - block
		if off < 0 {
			off = 0
		}
		chunk := buf[:end-off]
		if _, err := file.Seek(off, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.ReadFull(file, chunk); err != nil {
			return err
		}
		for i := len(chunk) - 1; i >= 0; i-- {
			if chunk[i] != '\n' {
				skipLast = false
				continue
			}
			if skipLast {
				skipLast = false
				continue
			}
			newlines++
			if newlines == n {
				start = off + int64(i) + 1
				break scan
			}
		}
		end = off
	}
	_, err = file.Seek(start, io.SeekStart)
	return err
}

// maxGuestText is the most guest text (console tail, messages quoting it)
// that goes into an API object.
const maxGuestText = 4096

// sanitizeGuestText makes text a guest printed fit for an API object: valid
// UTF-8, without C0 or C1 control characters other than newline and tab
// (no terminal escapes, carriage returns, NULs), and at most maxGuestText
// bytes, keeping its end (where a console's news is) on a rune boundary.
func sanitizeGuestText(s string) string {
	var b strings.Builder
	b.Grow(min(len(s), maxGuestText+utf8.UTFMax))
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		switch {
		case r == '\n' || r == '\t':
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f):
			continue
		case r == utf8.RuneError:
			r = '?'
		}
		b.WriteRune(r)
	}
	out := b.String()
	if len(out) <= maxGuestText {
		return out
	}
	cut := len(out) - maxGuestText
	for cut < len(out) && !utf8.RuneStart(out[cut]) {
		cut++
	}
	return out[cut:]
}

// Saved-state downloads: how large a state may be.
const (
	// stateHeaderSize is the fixed header of the qemu backend's saved state
	// (internal/backend/qemu/save.go); other backends have none.
	stateHeaderSize = 4096
	// stateFormatQEMU is the header's format.
	stateFormatQEMU = "kairon-qemu-save/1"
	// stateMargin is what a saved state may hold beyond the guest's memory:
	// device state, ROMs, the migration stream's framing.
	stateMargin = 64 << 20
)

// stateLimit is the most a saved state of a guest with memMiB of memory
// may take: neither the qemu header nor the stream states the stream's
// length, so the guest's memory plus a margin bounds it.
func stateLimit(memMiB int64) int64 {
	return stateHeaderSize + memMiB<<20 + memMiB<<20/8 + stateMargin
}

// declaredMemoryMiB reads the guest memory a qemu saved state's header
// declares; ok is false if head is not such a header.
func declaredMemoryMiB(head []byte) (memMiB int64, ok bool) {
	line, _, found := bytes.Cut(head, []byte("\n"))
	if !found {
		return 0, false
	}
	var h struct {
		Format    string `json:"format"`
		MemoryMiB int64  `json:"memoryMiB"`
	}
	if json.Unmarshal(line, &h) != nil || h.Format != stateFormatQEMU || h.MemoryMiB <= 0 || h.MemoryMiB > 1<<30 {
		return 0, false
	}
	return h.MemoryMiB, true
}

// errStateTooLarge says a saved state outgrew its limit.
func errStateTooLarge(limit int64) error {
	return fmt.Errorf("saved state exceeds its limit of %d bytes", limit)
}

// stateLimitOf is the most a saved state of the migration's Machine may
// take (stateLimit of its memory, 256 MiB if it states none, as attach does).
func (a *Agent) stateLimitOf(ctx context.Context, mig *kaironv1.MachineMigration) (int64, error) {
	machine := &kaironv1.Machine{}
	if err := a.mgr.GetAPIReader().Get(ctx, client.ObjectKey{Namespace: mig.Namespace, Name: mig.Spec.MachineName}, machine); err != nil {
		return 0, fmt.Errorf("reading machine %s/%s: %w", mig.Namespace, mig.Spec.MachineName, err)
	}
	memMiB := machine.Spec.Memory.Value() >> 20
	if memMiB <= 0 {
		memMiB = 256
	}
	return stateLimit(memMiB), nil
}

// saveStateDownload writes a saved state the node agent source sends
// (contentLength as announced, -1 if not) to path, through a temporary file
// that is removed if the state is not whole or outgrows limit, or the
// smaller limit its header's memory gives: no more than limit+1 bytes are
// ever written.
func saveStateDownload(path string, r io.Reader, contentLength, limit int64, source string) error {
	if contentLength > limit {
		return fmt.Errorf("node agent %s offers a saved state of %d bytes: %w", source, contentLength, errStateTooLarge(limit))
	}
	// Never more than announced: past it, the source is not believed.
	readLimit := limit + 1
	if contentLength >= 0 {
		readLimit = contentLength + 1
	}
	body := bufio.NewReaderSize(r, stateHeaderSize)
	if head, _ := body.Peek(stateHeaderSize); len(head) > 0 {
		if memMiB, ok := declaredMemoryMiB(head); ok && stateLimit(memMiB) < limit {
			limit = stateLimit(memMiB)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	n, copyErr := io.Copy(f, io.LimitReader(body, min(readLimit, limit+1)))
	if copyErr == nil && n > limit {
		copyErr = fmt.Errorf("node agent %s: %w", source, errStateTooLarge(limit))
	}
	if copyErr == nil && contentLength >= 0 && n != contentLength {
		copyErr = fmt.Errorf("node agent %s sent %d of %d bytes", source, n, contentLength)
	}
	if err := errors.Join(copyErr, f.Close()); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
