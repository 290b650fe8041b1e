package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Version is the protocol version this package speaks.
const Version = 1

// Frame layout, big-endian:
//
//	magic   [2]byte  "KG"
//	version uint8    Version
//	type    uint8    a Type
//	stream  uint32   the session the frame belongs to; 0 is the channel itself
//	length  uint32   payload bytes that follow, at most MaxPayload
//	payload [length]byte
const (
	headerSize = 12
	// MaxPayload bounds one frame's payload: a reader never allocates more
	// for a frame than this, whatever the length field says. Bulk data
	// (output, files) is sent as a sequence of frames.
	MaxPayload = 64 << 10
	// MaxControlPayload bounds the payload of a control frame (every type
	// but the data ones), which is decoded as JSON.
	MaxControlPayload = 16 << 10
)

var magic = [2]byte{'K', 'G'}

// Type says what a frame carries.
type Type uint8

// Frame types. Control frames carry one JSON message (messages.go); data
// frames carry raw bytes of one stream.
const (
	// TypeHello opens the channel from each side: the versions it speaks.
	TypeHello Type = 1
	// TypeRequest starts a session (exec, a file read or write, ping,
	// configure) on a new stream id chosen by the host.
	TypeRequest Type = 2
	// TypeResponse answers a Request: accepted, or why not.
	TypeResponse Type = 3
	// TypeStdin, TypeStdout and TypeStderr carry a session's bytes: a
	// command's standard streams, or a file's content (Stdin host to
	// guest, Stdout guest to host).
	TypeStdin  Type = 4
	TypeStdout Type = 5
	TypeStderr Type = 6
	// TypeClose ends one direction of a stream's data (JSON names which).
	TypeClose Type = 7
	// TypeExit ends a session with its result.
	TypeExit Type = 8
	// TypeResize changes a TTY session's window.
	TypeResize Type = 9
	// TypeCancel asks the guest to end a session now (a signal, or the
	// timeout reached on the host).
	TypeCancel Type = 10
	// TypeWindow grants the other side more bytes of one data stream:
	// flow control, so that neither side ever buffers past a bound or
	// stalls the channel for a slow stream.
	TypeWindow Type = 11
)

func (t Type) String() string {
	switch t {
	case TypeHello:
		return "Hello"
	case TypeRequest:
		return "Request"
	case TypeResponse:
		return "Response"
	case TypeStdin:
		return "Stdin"
	case TypeStdout:
		return "Stdout"
	case TypeStderr:
		return "Stderr"
	case TypeClose:
		return "Close"
	case TypeExit:
		return "Exit"
	case TypeResize:
		return "Resize"
	case TypeCancel:
		return "Cancel"
	case TypeWindow:
		return "Window"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// IsData says whether frames of t carry raw bytes rather than JSON.
func (t Type) IsData() bool { return t == TypeStdin || t == TypeStdout || t == TypeStderr }

func (t Type) known() bool { return t >= TypeHello && t <= TypeWindow }

// Frame is one decoded frame. Payload is the reader's own buffer, valid
// until its next ReadFrame.
type Frame struct {
	Type    Type
	Stream  uint32
	Payload []byte
}

// Errors a reader returns for a frame it refuses. After one of them the
// channel is out of step and must be reset: a peer that sent it is broken
// or hostile.
var (
	ErrBadMagic     = errors.New("wire: not a frame (bad magic)")
	ErrVersion      = errors.New("wire: unsupported frame version")
	ErrUnknownType  = errors.New("wire: unknown frame type")
	ErrTooLarge     = errors.New("wire: frame payload over the limit")
	ErrStreamZero   = errors.New("wire: session frame on stream 0")
	ErrHelloStream  = errors.New("wire: Hello on a session stream")
	ErrEmptyControl = errors.New("wire: control frame without a message")
)

// Reader reads frames from a byte stream, with one reused payload buffer.
type Reader struct {
	r      io.Reader
	header [headerSize]byte
	buf    []byte
}

// NewReader reads frames from r.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

// ReadFrame reads the next frame. It reads exactly the frame's bytes, never
// allocates more than MaxPayload, and refuses a frame that breaks the rules
// above (ErrBadMagic and the others; io.ErrUnexpectedEOF for a frame cut
// short; io.EOF only between frames).
func (fr *Reader) ReadFrame() (Frame, error) {
	if _, err := io.ReadFull(fr.r, fr.header[:]); err != nil {
		return Frame{}, err
	}
	h := fr.header
	if h[0] != magic[0] || h[1] != magic[1] {
		return Frame{}, ErrBadMagic
	}
	if h[2] != Version {
		return Frame{}, fmt.Errorf("%w %d (this side speaks %d)", ErrVersion, h[2], Version)
	}
	t := Type(h[3])
	if !t.known() {
		return Frame{}, fmt.Errorf("%w %d", ErrUnknownType, h[3])
	}
	stream := binary.BigEndian.Uint32(h[4:8])
	length := binary.BigEndian.Uint32(h[8:12])
	limit := uint32(MaxControlPayload)
	if t.IsData() {
		limit = MaxPayload
	}
	if length > limit {
		return Frame{}, fmt.Errorf("%w: %s frame of %d bytes (at most %d)", ErrTooLarge, t, length, limit)
	}
	switch {
	case t == TypeHello && stream != 0:
		return Frame{}, ErrHelloStream
	case t != TypeHello && stream == 0:
		return Frame{}, fmt.Errorf("%w (%s)", ErrStreamZero, t)
	case !t.IsData() && length == 0:
		return Frame{}, fmt.Errorf("%w (%s)", ErrEmptyControl, t)
	}
	if cap(fr.buf) < int(length) {
		fr.buf = make([]byte, length)
	}
	payload := fr.buf[:length]
	if _, err := io.ReadFull(fr.r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return Frame{Type: t, Stream: stream, Payload: payload}, nil
}

// AppendFrame appends f's encoding to b. It refuses what ReadFrame would.
func AppendFrame(b []byte, f Frame) ([]byte, error) {
	limit := MaxControlPayload
	if f.Type.IsData() {
		limit = MaxPayload
	}
	switch {
	case !f.Type.known():
		return b, fmt.Errorf("%w %d", ErrUnknownType, uint8(f.Type))
	case len(f.Payload) > limit:
		return b, fmt.Errorf("%w: %s frame of %d bytes (at most %d)", ErrTooLarge, f.Type, len(f.Payload), limit)
	case f.Type == TypeHello && f.Stream != 0:
		return b, ErrHelloStream
	case f.Type != TypeHello && f.Stream == 0:
		return b, fmt.Errorf("%w (%s)", ErrStreamZero, f.Type)
	case !f.Type.IsData() && len(f.Payload) == 0:
		return b, fmt.Errorf("%w (%s)", ErrEmptyControl, f.Type)
	}
	var h [headerSize]byte
	h[0], h[1], h[2], h[3] = magic[0], magic[1], Version, byte(f.Type)
	binary.BigEndian.PutUint32(h[4:8], f.Stream)
	binary.BigEndian.PutUint32(h[8:12], uint32(len(f.Payload)))
	b = append(b, h[:]...)
	return append(b, f.Payload...), nil
}

// WriteFrame writes f to w in one Write.
func WriteFrame(w io.Writer, f Frame) error {
	b, err := AppendFrame(make([]byte, 0, headerSize+len(f.Payload)), f)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// WriteData writes p as data frames of type t on stream, split at
// MaxPayload.
func WriteData(w io.Writer, t Type, stream uint32, p []byte) error {
	if !t.IsData() {
		return fmt.Errorf("wire: %s is not a data frame type", t)
	}
	for len(p) > 0 {
		n := min(len(p), MaxPayload)
		if err := WriteFrame(w, Frame{Type: t, Stream: stream, Payload: p[:n]}); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}
