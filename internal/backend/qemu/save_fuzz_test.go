package qemu

import (
	"bytes"
	"io"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

// countingReader counts what readHeader takes from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// FuzzReadHeader: the header of a saved state or of a live migration
// stream comes from a file or another node. Whatever its bytes, readHeader
// does not panic, reads exactly saveHeaderSize bytes (the QEMU stream after
// it is left intact) and never more, allocates a bounded amount, fails on
// input shorter than a header, and accepts only a Kairon header, which then
// survives encodeHeader and readHeader unchanged.
func FuzzReadHeader(f *testing.F) {
	valid, err := encodeHeader(saveHeader{
		Format: saveFormat, ID: "default_vm", Name: "vm", CPU: 2, MemoryMiB: 512, NIC: true, Ready: true,
		Acceleration: "kvm", SavedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	})
	if err != nil {
		f.Fatal(err)
	}
	pad := func(s string) []byte { return append([]byte(s+"\n"), make([]byte, saveHeaderSize)...) }
	for _, seed := range [][]byte{
		valid, append(bytes.Clone(valid), "QEVM\x00\x00\x00\x03"...), valid[:100], valid[:saveHeaderSize-1], nil,
		pad(`{}`), pad(`null`), pad(`{"format":"kairon-qemu-save/2"}`), pad(`{"format":"kairon-qemu-save/1","cpu":-1,"memoryMiB":-9223372036854775808}`),
		pad(`{"format":"kairon-qemu-save/1","cpu":99999999999}`), pad(`[` + strings.Repeat(`[`, 3000)),
		pad(`{"format":"kairon-qemu-save/1","name":"` + strings.Repeat("\\u0000", 600) + `"}`),
		bytes.Repeat([]byte{0xff}, saveHeaderSize+10), bytes.Repeat([]byte("\n"), saveHeaderSize),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const tail = "<qemu stream>"
		in := &countingReader{r: io.MultiReader(bytes.NewReader(data), strings.NewReader(tail))}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		h, err := readHeader(in, "fuzz")
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 256<<10 {
			t.Fatalf("readHeader allocated %d bytes for a %d-byte header", grew, saveHeaderSize)
		}
		if in.n > saveHeaderSize {
			t.Fatalf("readHeader read %d bytes, past the %d-byte header", in.n, saveHeaderSize)
		}
		if len(data)+len(tail) < saveHeaderSize {
			if err == nil {
				t.Fatalf("%d bytes (less than a header) accepted as %+v", len(data)+len(tail), h)
			}
			return
		}
		if in.n != saveHeaderSize {
			t.Fatalf("readHeader read %d bytes, want the whole %d-byte header", in.n, saveHeaderSize)
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "qemu: restore fuzz: ") {
				t.Fatalf("error %q does not name the source", err)
			}
			return
		}
		if h.Format != saveFormat {
			t.Fatalf("accepted a header of format %q", h.Format)
		}
		// What was accepted can be written again, if it fits, and reads back
		// the same.
		buf, err := encodeHeader(h)
		if err != nil {
			return
		}
		again, err := readHeader(bytes.NewReader(buf), "again")
		if err != nil {
			t.Fatalf("an accepted header %+v does not read back: %v", h, err)
		}
		if !again.SavedAt.Equal(h.SavedAt) {
			t.Fatalf("savedAt %v read back as %v", h.SavedAt, again.SavedAt)
		}
		again.SavedAt = h.SavedAt
		if !reflect.DeepEqual(again, h) {
			t.Fatalf("header %+v read back as %+v", h, again)
		}
	})
}
