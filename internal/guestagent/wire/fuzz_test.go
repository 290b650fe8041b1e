package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzReadFrame feeds the channel whatever a guest might write. The reader
// never panics, never allocates past MaxPayload, refuses or returns whole
// frames only, and a returned control frame's message either decodes and
// re-encodes to itself or is refused; a re-encoded frame reads back the same.
// The seeds are in testdata/fuzz/FuzzReadFrame.
func FuzzReadFrame(f *testing.F) {
	for _, m := range []struct {
		stream uint32
		m      any
	}{
		{0, &Hello{Versions: []int{1}, Agent: "kairon-guest-agent"}},
		{1, &Request{Op: OpExec, Exec: &Exec{Args: []string{"sh", "-c", "true"}}}},
		{1, &Exit{Code: 0}},
		{1, &Window{Stream: "stdout", Bytes: InitialWindow}},
		{2, &Request{Op: OpExec, Exec: &Exec{Args: []string{"id"}, User: "1000:staff"}}},
		{2, &Exit{Status: &Status{Boot: "n0nce", Ready: true, Main: &MainProcess{State: MainExited, ExitCode: -1, Signal: "KILL"}}}},
	} {
		fr, err := Encode(m.stream, m.m)
		if err != nil {
			f.Fatal(err)
		}
		b, err := AppendFrame(nil, fr)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data))
		consumed := 0
		for {
			fr, err := r.ReadFrame()
			if cap(r.buf) > MaxPayload {
				t.Fatalf("the reader allocated %d bytes", cap(r.buf))
			}
			if err != nil {
				if errors.Is(err, io.EOF) && consumed != len(data) {
					t.Fatalf("io.EOF after %d of %d bytes", consumed, len(data))
				}
				return
			}
			consumed += headerSize + len(fr.Payload)
			again, err := AppendFrame(nil, fr)
			if err != nil {
				t.Fatalf("a frame the reader accepted does not encode: %v", err)
			}
			if back, err := NewReader(bytes.NewReader(again)).ReadFrame(); err != nil || back.Type != fr.Type || back.Stream != fr.Stream || !bytes.Equal(back.Payload, fr.Payload) {
				t.Fatalf("re-encoded frame reads back as %+v, %v", back, err)
			}
			if fr.Type.IsData() {
				continue
			}
			m, err := Decode(fr)
			if err != nil {
				continue
			}
			if _, err := Encode(fr.Stream, m); err != nil {
				t.Fatalf("a message Decode accepted does not encode: %v (%#v)", err, m)
			}
		}
	})
}
