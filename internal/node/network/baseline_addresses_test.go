package network

import (
	"net/netip"
	"strings"
	"testing"
)

// The set of a namespace's guest addresses follows its guests: a guest's
// address joins with its tap, leaves with it while the namespace keeps
// other taps, and the addresses of guests on other nodes come from
// SetNamespaceAddresses; the set goes with the namespace's last tap.
func TestBaselineNamespaceAddresses(t *testing.T) {
	n := newTestNet(t, "node-a")
	x := n.guest(t, n.baseline, "node-a", "team-a", "x", "10.88.1.2")
	y := n.guest(t, n.baseline, "node-a", "team-a", "y", "10.88.1.3")
	set := func() string {
		t.Helper()
		out, err := n.baseline.output("list", "set", "bridge", BaselineTable, ipsSet("team-a", n.baseline.tag()))
		if err != nil {
			return err.Error()
		}
		return out
	}
	has := func(want ...string) {
		t.Helper()
		out := set()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("ips_team-a lacks %s:\n%s", w, out)
			}
		}
	}
	hasNot := func(addr string) {
		t.Helper()
		if out := set(); strings.Contains(out, addr) {
			t.Errorf("ips_team-a still holds %s:\n%s", addr, out)
		}
	}
	has("10.88.1.2", "10.88.1.3")
	if err := n.baseline.SetNamespaceAddresses(map[string][]netip.Addr{"team-a": addrs("10.88.2.7")}); err != nil {
		t.Fatal(err)
	}
	has("10.88.1.2", "10.88.1.3", "10.88.2.7")
	if err := n.baseline.SetNamespaceAddresses(map[string][]netip.Addr{"team-a": nil, "team-b": addrs("10.88.2.8")}); err != nil {
		t.Fatal(err)
	}
	hasNot("10.88.2.7")
	if out, err := n.baseline.output("list", "set", "bridge", BaselineTable, ipsSet("team-b", n.baseline.tag())); err == nil {
		t.Errorf("a set for team-b, which has no tap here:\n%s", out)
	}
	if err := n.baseline.Remove(y.Tap, "team-a"); err != nil {
		t.Fatal(err)
	}
	has("10.88.1.2")
	hasNot("10.88.1.3")
	if err := n.baseline.Remove(x.Tap, "team-a"); err != nil {
		t.Fatal(err)
	}
	if out := set(); !strings.Contains(out, "No such file or directory") {
		t.Errorf("ips_team-a left after the namespace's last tap:\n%s", out)
	}
}
