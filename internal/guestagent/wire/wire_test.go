package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func header(version, typ byte, stream, length uint32) []byte {
	h := []byte{'K', 'G', version, typ, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(h[4:], stream)
	binary.BigEndian.PutUint32(h[8:], length)
	return h
}

func TestFramesRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	msgs := []struct {
		stream uint32
		m      any
	}{
		{0, &Hello{Versions: []int{1}, Agent: "kairon-guest-agent/v0.1"}},
		{7, &Request{Op: OpExec, Exec: &Exec{Args: []string{"sh", "-c", "echo hi"}, Env: []string{"A=b"}, Dir: "/tmp", TimeoutSeconds: 30}}},
		{7, &Response{OK: true}},
		{7, &Close{Stream: "stdin"}},
		{7, &Exit{Code: 3}},
		{8, &Request{Op: OpWriteFile, File: &File{Path: "/root/x.py", Mode: 0o755}}},
		{9, &Request{Op: OpConfigure, Configure: &Configure{Hostname: "web-1", MAC: "52:54:00:12:34:56", Addresses: []string{"10.88.0.5/24"}, Gateway: "10.88.0.1", DNS: []string{"10.88.0.1"}, Seed: []byte{1, 2, 3}}}},
		{9, &Resize{Rows: 40, Cols: 120}},
		{9, &Cancel{Signal: "TERM"}},
		{10, &Request{Op: OpPing}},
		{10, &Window{Stream: "stdout", Bytes: InitialWindow}},
		{11, &Request{Op: OpExec, Exec: &Exec{Args: []string{"id"}, User: "app:staff"}}},
		{11, &Exit{Status: &Status{Boot: "n0nce", Ready: true, Main: &MainProcess{State: MainRunning}}}},
		{12, &Exit{Status: &Status{Boot: "n0nce", Ready: true, Main: &MainProcess{State: MainExited, ExitCode: 3}}}},
		{13, &Exit{Status: &Status{Main: &MainProcess{State: MainExited, ExitCode: -1, Signal: "SIG38"}}}},
	}
	for _, m := range msgs {
		f, err := Encode(m.stream, m.m)
		if err != nil {
			t.Fatalf("encoding %#v: %v", m.m, err)
		}
		if err := WriteFrame(&buf, f); err != nil {
			t.Fatal(err)
		}
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), (MaxPayload*2+100)/16)
	if err := WriteData(&buf, TypeStdout, 7, big); err != nil {
		t.Fatal(err)
	}

	r := NewReader(&buf)
	for _, m := range msgs {
		f, err := r.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(f)
		if err != nil {
			t.Fatalf("decoding %s: %v", f.Type, err)
		}
		if f.Stream != m.stream || !reflect.DeepEqual(got, m.m) {
			t.Errorf("got %#v on stream %d, want %#v on %d", got, f.Stream, m.m, m.stream)
		}
	}
	var data []byte
	frames := 0
	for {
		f, err := r.ReadFrame()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if f.Type != TypeStdout || f.Stream != 7 || len(f.Payload) > MaxPayload {
			t.Fatalf("data frame %s on %d, %d bytes", f.Type, f.Stream, len(f.Payload))
		}
		data = append(data, f.Payload...)
		frames++
	}
	if !bytes.Equal(data, big) || frames != 3 {
		t.Errorf("data came back as %d bytes in %d frames, want %d in 3", len(data), frames, len(big))
	}
}

// What a broken or hostile guest may write: each is refused with its own
// error, without reading (or allocating) the payload it announces.
func TestReadFrameRefuses(t *testing.T) {
	tests := []struct {
		name  string
		input []byte
		want  error
	}{
		{"bad magic", append([]byte("GET / HTTP/1.1\r\n"), 0), ErrBadMagic},
		{"another version", header(2, byte(TypeHello), 0, 2), ErrVersion},
		{"unknown type", header(1, 99, 1, 0), ErrUnknownType},
		{"the type after the last", header(1, byte(TypeWindow)+1, 1, 2), ErrUnknownType},
		{"type zero", header(1, 0, 1, 0), ErrUnknownType},
		{"a 4 GiB data frame", header(1, byte(TypeStdout), 1, 0xffffffff), ErrTooLarge},
		{"a control frame over its limit", header(1, byte(TypeExit), 1, MaxControlPayload+1), ErrTooLarge},
		{"a session frame on stream 0", header(1, byte(TypeRequest), 0, 2), ErrStreamZero},
		{"hello on a session stream", header(1, byte(TypeHello), 3, 2), ErrHelloStream},
		{"an empty control frame", header(1, byte(TypeExit), 3, 0), ErrEmptyControl},
		{"a header cut short", []byte{'K', 'G', 1}, io.ErrUnexpectedEOF},
		{"a payload cut short", append(header(1, byte(TypeStdout), 1, 10), "abc"...), io.ErrUnexpectedEOF},
		{"nothing", nil, io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(tt.input))
			_, err := r.ReadFrame()
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			if cap(r.buf) > MaxPayload {
				t.Errorf("the reader allocated %d bytes", cap(r.buf))
			}
		})
	}
}

func TestDecodeRefuses(t *testing.T) {
	tests := []struct {
		name    string
		typ     Type
		payload string
		want    string
	}{
		{"unknown field", TypeExit, `{"code":0,"extra":1}`, "unknown field"},
		{"two values", TypeExit, `{"code":0}{"code":1}`, "more than one JSON value"},
		{"not JSON", TypeResponse, `ok`, "invalid character"},
		{"data frames are no message", TypeStdout, `{}`, "carry data"},
		{"no versions", TypeHello, `{"versions":[]}`, "hello.versions"},
		{"unknown op", TypeRequest, `{"op":"format-disk"}`, `request.op "format-disk"`},
		{"exec without args", TypeRequest, `{"op":"exec","exec":{"args":[]}}`, "exec.args: 1 to 256"},
		{"exec with a file too", TypeRequest, `{"op":"exec","exec":{"args":["true"]},"file":{"path":"/x"}}`, "takes request.exec and no other"},
		{"NUL in an argument", TypeRequest, `{"op":"exec","exec":{"args":["a\u0000b"]}}`, "no NUL"},
		{"env without =", TypeRequest, `{"op":"exec","exec":{"args":["env"],"env":["PATH"]}}`, "exec.env[0]"},
		{"relative dir", TypeRequest, `{"op":"exec","exec":{"args":["ls"],"dir":"tmp"}}`, "exec.dir"},
		{"negative timeout", TypeRequest, `{"op":"exec","exec":{"args":["ls"],"timeoutSeconds":-1}}`, "timeoutSeconds"},
		{"window without a tty", TypeRequest, `{"op":"exec","exec":{"args":["ls"],"rows":10,"cols":10}}`, "for a TTY only"},
		{"relative file", TypeRequest, `{"op":"read","file":{"path":"etc/passwd"}}`, "file.path"},
		{"mode beyond permissions", TypeRequest, `{"op":"write","file":{"path":"/x","mode":65535}}`, "permission bits only"},
		{"hostname with a dot", TypeRequest, `{"op":"configure","configure":{"hostname":"a.b"}}`, "configure.hostname"},
		{"multicast MAC", TypeRequest, `{"op":"configure","configure":{"mac":"01:00:5e:00:00:01"}}`, "configure.mac"},
		{"MAC that is not one", TypeRequest, `{"op":"configure","configure":{"mac":"eth0"}}`, "configure.mac"},
		{"address without a prefix", TypeRequest, `{"op":"configure","configure":{"addresses":["10.0.0.1"]}}`, "CIDR"},
		{"ping with arguments", TypeRequest, `{"op":"ping","exec":{"args":["x"]}}`, "takes no arguments"},
		{"refusal without a reason", TypeResponse, `{"ok":false}`, "without a reason"},
		{"exit code out of range", TypeExit, `{"code":256}`, "exit.code"},
		{"unknown signal", TypeCancel, `{"signal":"STOP"}`, "cancel.signal"},
		{"unknown close", TypeClose, `{"stream":"stdwhat"}`, "close.stream"},
		{"zero window", TypeResize, `{"rows":0,"cols":80}`, "must be positive"},
		{"empty grant", TypeWindow, `{"stream":"stdout","bytes":0}`, "window.bytes"},
		{"grant past the limit", TypeWindow, `{"stream":"stdin","bytes":16777217}`, "window.bytes"},
		{"grant on no stream", TypeWindow, `{"stream":"tty","bytes":1}`, "window.stream"},
		{"user with two colons", TypeRequest, `{"op":"exec","exec":{"args":["id"],"user":"a:b:c"}}`, "exec.user"},
		{"user without a name", TypeRequest, `{"op":"exec","exec":{"args":["id"],"user":":0"}}`, "exec.user"},
		{"user with an empty group", TypeRequest, `{"op":"exec","exec":{"args":["id"],"user":"app:"}}`, "exec.user"},
		{"user with a newline", TypeRequest, `{"op":"exec","exec":{"args":["id"],"user":"ro\not"}}`, "exec.user"},
		{"user too long", TypeRequest, `{"op":"exec","exec":{"args":["id"],"user":"` + strings.Repeat("u", MaxUserLen+1) + `"}}`, "exec.user"},
		{"main in no state", TypeExit, `{"code":0,"status":{"main":{"state":"sleeping"}}}`, "status.main.state"},
		{"main running with a code", TypeExit, `{"code":0,"status":{"main":{"state":"running","exitCode":1}}}`, "running process"},
		{"main exit code out of range", TypeExit, `{"code":0,"status":{"main":{"state":"exited","exitCode":256}}}`, "status.main.exitCode"},
		{"main negative exit code", TypeExit, `{"code":0,"status":{"main":{"state":"exited","exitCode":-2}}}`, "status.main.exitCode"},
		{"main signal with a code", TypeExit, `{"code":0,"status":{"main":{"state":"exited","exitCode":9,"signal":"KILL"}}}`, "status.main.signal"},
		{"main signal not a name", TypeExit, `{"code":0,"status":{"main":{"state":"exited","exitCode":-1,"signal":"\u001b[2J"}}}`, "status.main.signal"},
		{"main signal too long", TypeExit, `{"code":0,"status":{"main":{"state":"exited","exitCode":-1,"signal":"SIGNALNAME"}}}`, "status.main.signal"},
		{"main with an unknown field", TypeExit, `{"code":0,"status":{"main":{"state":"exited","pid":1}}}`, "unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(Frame{Type: tt.typ, Stream: 1, Payload: []byte(tt.payload)})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

func TestEncodeRefusesWhatDecodeWould(t *testing.T) {
	if _, err := Encode(1, &Exec{Args: []string{"x"}}); err == nil {
		t.Error("encoded an Exec outside a Request")
	}
	if _, err := Encode(1, &Request{Op: OpExec}); err == nil {
		t.Error("encoded an exec request without its arguments")
	}
	if err := WriteFrame(io.Discard, Frame{Type: TypeStdout, Stream: 1, Payload: make([]byte, MaxPayload+1)}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("writing an oversized frame: %v", err)
	}
	if err := WriteFrame(io.Discard, Frame{Type: TypeRequest, Payload: []byte("{}")}); !errors.Is(err, ErrStreamZero) {
		t.Errorf("writing a request on stream 0: %v", err)
	}
}

// An old agent's status has no main process; one of an image guest does,
// and says what became of it.
func TestStatusMain(t *testing.T) {
	m, err := Decode(Frame{Type: TypeExit, Stream: 1, Payload: []byte(`{"code":0,"status":{"boot":"n0nce","ready":true}}`)})
	if err != nil || m.(*Exit).Status.Main != nil {
		t.Fatalf("an old agent's status: %+v, %v", m, err)
	}
	for _, tc := range []struct {
		m    MainProcess
		want string
	}{
		{MainProcess{State: MainRunning}, "running"},
		{MainProcess{State: MainExited, ExitCode: 3}, "exited with code 3"},
		{MainProcess{State: MainExited, ExitCode: -1, Signal: "KILL"}, "killed by signal KILL"},
	} {
		if err := tc.m.Validate(); err != nil || tc.m.String() != tc.want {
			t.Errorf("%+v: %q, %v; want %q", tc.m, tc.m.String(), err, tc.want)
		}
	}
}

func TestHelloShared(t *testing.T) {
	if v, ok := (&Hello{Versions: []int{1, 2, 3}}).Shared(); !ok || v != 1 {
		t.Errorf("shared version %d %v, want 1", v, ok)
	}
	if _, ok := (&Hello{Versions: []int{2}}).Shared(); ok {
		t.Error("a peer speaking only version 2 shares one with this side")
	}
}
