package egress

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAutoUpstream(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, tc := range []struct {
		name, host, resolved, want, wantErr string
	}{
		{name: "a plain resolver", host: "search example\nnameserver 192.0.2.53\nnameserver 192.0.2.54\n", resolved: "nameserver 198.51.100.1\n", want: "192.0.2.53:53"},
		{name: "systemd-resolved's stub", host: "nameserver 127.0.0.53\noptions edns0\n", resolved: "# managed\nnameserver 198.51.100.1\n", want: "198.51.100.1:53"},
		{name: "a stub without resolved's list", host: "nameserver 127.0.0.1\n", want: "127.0.0.1:53"},
		{name: "resolved's list only loopback", host: "nameserver 127.0.0.53\n", resolved: "nameserver ::1\n", want: "127.0.0.53:53"},
		{name: "IPv6 first", host: "nameserver 2001:db8::53\n", want: "[2001:db8::53]:53"},
		{name: "no nameserver", host: "search example\n", wantErr: "names no nameserver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			savedHost, savedResolved := hostResolvConf, resolvedResolvConf
			t.Cleanup(func() { hostResolvConf, resolvedResolvConf = savedHost, savedResolved })
			hostResolvConf = write("host-"+tc.name, tc.host)
			resolvedResolvConf = filepath.Join(dir, "absent")
			if tc.resolved != "" {
				resolvedResolvConf = write("resolved-"+tc.name, tc.resolved)
			}
			got, err := AutoUpstream()
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("AutoUpstream = %q, %v; want an error saying %q", got, err, tc.wantErr)
				}
			case err != nil || got != tc.want:
				t.Errorf("AutoUpstream = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
