package egress

import (
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// nftScript runs script in ns with the nft command, as the enforcer did
// before it spoke netlink.
func nftScript(t *testing.T, ns, script string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f in %s: %v: %s\nscript:\n%s", ns, err, out, script)
	}
}

var timeouts = regexp.MustCompile(`timeout [0-9a-z]+ expires [0-9a-z]+`)

// listing is ns's egress tables as nft lists them, counters, handles and
// expiries aside.
func listing(t *testing.T, ns string) string {
	t.Helper()
	rs := run(t, "ip", "netns", "exec", ns, "nft", "list", "table", "bridge", Table) +
		run(t, "ip", "netns", "exec", ns, "nft", "list", "table", "inet", Table)
	rs = counts.ReplaceAllString(rs, "packets N bytes N")
	return timeouts.ReplaceAllString(rs, "timeout T expires T")
}

// TestNetlinkMatchesScript builds the same state twice, once with the
// enforcer's netlink batches and once with the nft text they replaced
// (script_test.go), and compares how nft lists the two: every rule, set,
// element and map entry must be the same.
func TestNetlinkMatchesScript(t *testing.T) {
	viaNetlink, viaText := testNetNS(t), testNetNS(t)
	t.Cleanup(func() { _ = RemoveTables(viaNetlink); _ = RemoveTables(viaText) })
	e := &Enforcer{NetNS: viaNetlink, Bridge: "kbr0", Network: netip.MustParsePrefix("10.88.0.0/16"), Gateway: netip.MustParseAddr("10.88.0.1"), DNSPort: 5353, SNIPort: 5354, Masquerade: "up0"}
	if err := e.Setup(); err != nil {
		t.Fatal(err)
	}
	nftScript(t, viaText, e.setupScript())
	// Once Repair has written the Machines in the order of a map, the
	// listings are compared line by line.
	unordered := false
	compare := func(step string) {
		t.Helper()
		got, want := listing(t, viaNetlink), listing(t, viaText)
		if unordered {
			got, want = sortedLines(got), sortedLines(want)
		}
		if got != want {
			t.Fatalf("%s: the netlink ruleset differs from the script's\n%s", step, lineDiff(want, got))
		}
	}
	compare("setup")

	machines := []Machine{
		{Namespace: "team-a", Name: "a", Tap: "kt0123456789", MAC: macOf("team-a", "a"), IP: netip.MustParseAddr("10.88.1.2")},
		{Namespace: "team-a", Name: "b", Tap: "kt_b.c-d", MAC: macOf("team-a", "b"), IP: netip.MustParseAddr("10.88.1.3")},
		{Namespace: "team-b", Name: "c", Tap: "kt0000000003", MAC: macOf("team-b", "c"), IP: netip.MustParseAddr("10.88.1.4")},
	}
	policies := []*Policy{
		mustCompile(t,
			kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24", "169.254.169.254/32", "10.88.1.3/32"}, AllowPorts: []kaironv1.PortRange{"8000-8100", "443"}, AllowIcmp: true},
			kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pkg.test", "*.pkg.test"}},
			kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"tls.test"}, AllowSNI: []kaironv1.ServerName{"tls.test"}, AllowPorts: []kaironv1.PortRange{"443"}},
		),
		// Single elements, a lone range, unaligned and overlapping
		// prefixes, adjacent ones nft merges.
		mustCompile(t,
			kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"198.51.100.7/32"}, AllowPorts: []kaironv1.PortRange{"8000-8100"}},
			kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"192.0.2.0/25", "192.0.2.128/25", "172.16.0.0/12", "172.16.4.0/24"}, AllowPorts: []kaironv1.PortRange{"53", "80-81", "82"}, AllowIcmp: true},
			kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"100.64.0.0/10"}, AllowSNI: []kaironv1.ServerName{"*.example.test"}},
			kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"0.0.0.0/8", "224.0.0.0/4"}},
		),
		mustCompile(t, kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pkg.test"}, AllowPorts: []kaironv1.PortRange{"443"}}),
	}
	// A new Machine: Apply's lean transaction, as lean wrote it.
	for i, m := range machines {
		if err := e.Apply(m, policies[i]); err != nil {
			t.Fatal(err)
		}
		nftScript(t, viaText, lean(e.machineScript(m, policies[i], nil), true, true))
	}
	compare("new Machines")

	// New policies for known Machines, stale learned sets going.
	for i, m := range machines {
		old, p := policies[i], policies[(i+1)%len(policies)]
		if err := e.Apply(m, p); err != nil {
			t.Fatal(err)
		}
		var stale []string
		for _, set := range learnedSets(m.Tap, old) {
			if !strings.Contains(strings.Join(learnedSets(m.Tap, p), " "), set) {
				stale = append(stale, set)
			}
		}
		nftScript(t, viaText, lean(e.machineScript(m, p, stale), false, !hasSNI(old)))
	}
	compare("changed policies")

	// The whole address space, alone and with another net.
	everywhere := Machine{Namespace: "team-c", Name: "d", Tap: "kt0000000004", MAC: macOf("team-c", "d"), IP: netip.MustParseAddr("10.88.1.5")}
	for i, cidrs := range [][]kaironv1.CIDR{{"0.0.0.0/0"}, {"0.0.0.0/0", "198.51.100.0/24"}} {
		p := mustCompile(t, kaironv1.EgressRules{AllowCidrs: cidrs, AllowPorts: []kaironv1.PortRange{"1-65535"}})
		if err := e.Apply(everywhere, p); err != nil {
			t.Fatal(err)
		}
		nftScript(t, viaText, lean(e.machineScript(everywhere, p, nil), i == 0, true))
		compare("the whole address space " + fmt.Sprint(cidrs))
	}

	// Learned addresses, with their timeouts.
	m := machines[2] // now under policies[0]
	addrs := []netip.Addr{netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")}
	if err := e.Learn(m.IP, "a.pkg.test", addrs, 300*time.Second); err != nil {
		t.Fatal(err)
	}
	set := "inet " + Table + " " + learnedSetName(m.Tap, policies[0].Grants[1].ID())
	nftScript(t, viaText, "add element "+set+" { 203.0.113.10, 203.0.113.11 }\n"+
		"delete element "+set+" { 203.0.113.10, 203.0.113.11 }\n"+
		"add element "+set+" { 203.0.113.10 timeout 305s, 203.0.113.11 timeout 305s }\n")
	compare("learned addresses")

	// The careful path: the address moves.
	moved := machines[1]
	moved.IP = netip.MustParseAddr("10.88.2.9")
	p := policies[2]
	if err := e.Apply(moved, p); err != nil {
		t.Fatal(err)
	}
	nftScript(t, viaText, e.machineScript(moved, p, nil)+e.forgetKey(moved.Tap, keyText(machines[1]), machines[1].Tap))
	compare("moved address")

	// Repair after a flush of everything.
	for _, ns := range []string{viaNetlink, viaText} {
		run(t, "ip", "netns", "exec", ns, "nft", "flush", "ruleset")
	}
	if repaired, err := e.Repair(); err != nil || !repaired {
		t.Fatalf("Repair after a flush = %v, %v", repaired, err)
	}
	script := e.setupScript()
	for _, a := range e.machines {
		script += e.machineScript(a.m, a.policy, nil)
	}
	nftScript(t, viaText, script)
	unordered = true
	compare("repair")
	if repaired, err := e.Repair(); err != nil || repaired {
		t.Fatalf("Repair of intact rules = %v, %v", repaired, err)
	}

	// Removal, of a Machine applied here and of one found at Setup.
	if err := e.Remove(machines[0].Tap); err != nil {
		t.Fatal(err)
	}
	nftScript(t, viaText, e.removeScript(machines[0].Tap, keyText(machines[0]), machines[0].Tap, learnedSets(machines[0].Tap, policies[1])))
	compare("removal")
	restarted := &Enforcer{NetNS: viaNetlink, Bridge: e.Bridge, Network: e.Network, Gateway: e.Gateway, DNSPort: e.DNSPort, SNIPort: e.SNIPort, Masquerade: e.Masquerade}
	if err := restarted.Setup(); err != nil {
		t.Fatal(err)
	}
	nftScript(t, viaText, e.setupScript())
	if err := restarted.Remove(m.Tap); err != nil {
		t.Fatal(err)
	}
	nftScript(t, viaText, e.removeScript(m.Tap, keyText(m), m.Tap, learnedSets(m.Tap, policies[0])))
	compare("removal after a restart")

	if err := RemoveTables(viaNetlink); err != nil {
		t.Fatal(err)
	}
	if out := run(t, "ip", "netns", "exec", viaNetlink, "nft", "list", "ruleset"); strings.TrimSpace(out) != "" {
		t.Fatalf("RemoveTables left:\n%s", out)
	}
}

func sortedLines(s string) string {
	lines := strings.Split(s, "\n")
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// lineDiff shows the lines of got that want lacks (+) and the reverse (-).
func lineDiff(want, got string) string {
	count := func(s string) map[string]int {
		c := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			c[l]++
		}
		return c
	}
	w, g := count(want), count(got)
	var out strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if g[l] < w[l] {
			out.WriteString("- " + l + "\n")
			g[l]++
		}
	}
	w = count(want)
	g = count(got)
	for _, l := range strings.Split(got, "\n") {
		if w[l] < g[l] {
			out.WriteString("+ " + l + "\n")
			w[l]++
		}
	}
	return out.String() + "\nscript's:\n" + want + "\nnetlink's:\n" + got
}

// TestLargeBatches: a Machine with a large policy, and a repair of 200
// Machines, each one batch, whose answers must fit the session's sockets.
func TestLargeBatches(t *testing.T) {
	ns := testNetNS(t)
	t.Cleanup(func() { _ = RemoveTables(ns) })
	e := &Enforcer{NetNS: ns, Bridge: "kbr0", Network: netip.MustParsePrefix("10.88.0.0/16"), Gateway: netip.MustParseAddr("10.88.0.1"), DNSPort: 5353, SNIPort: 5354}
	if err := e.Setup(); err != nil {
		t.Fatal(err)
	}
	var rules []kaironv1.EgressRules
	for i := range 60 {
		rules = append(rules, kaironv1.EgressRules{
			AllowCidrs: []kaironv1.CIDR{kaironv1.CIDR(fmt.Sprintf("198.18.%d.0/24", i)), kaironv1.CIDR(fmt.Sprintf("198.19.%d.0/25", i))},
			AllowFqdns: []kaironv1.Hostname{kaironv1.Hostname(fmt.Sprintf("h%d.test", i))},
			AllowPorts: []kaironv1.PortRange{kaironv1.PortRange(fmt.Sprint(1000 + i)), "443"},
			AllowIcmp:  true,
		})
	}
	large := mustCompile(t, rules...)
	big := Machine{Namespace: "team-a", Name: "big", Tap: "ktbig", MAC: macOf("team-a", "big"), IP: netip.MustParseAddr("10.88.9.9")}
	if err := e.Apply(big, large); err != nil {
		t.Fatalf("a policy of 60 grants: %v", err)
	}
	if n := strings.Count(listing(t, ns), "counter name \"d_ktbig_port\" drop"); n != 120 {
		t.Fatalf("%d port drops in the large Machine's chain, want 120 (two per grant)", n)
	}
	p := mustCompile(t, kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"203.0.113.0/24"}, AllowFqdns: []kaironv1.Hostname{"pkg.test"}, AllowPorts: []kaironv1.PortRange{"443"}})
	for i := range 200 {
		m := Machine{Namespace: "crowd", Name: fmt.Sprint(i), Tap: fmt.Sprintf("kc%010d", i), MAC: macOf("crowd", fmt.Sprint(i)), IP: netip.AddrFrom4([4]byte{10, 88, byte(200 + i/250), byte(2 + i%250)})}
		if err := e.Apply(m, p); err != nil {
			t.Fatal(err)
		}
	}
	before := listing(t, ns)
	run(t, "ip", "netns", "exec", ns, "nft", "flush", "ruleset")
	if repaired, err := e.Repair(); err != nil || !repaired {
		t.Fatalf("Repair of 201 Machines after a flush = %v, %v", repaired, err)
	}
	if repaired, err := e.Repair(); err != nil || repaired {
		t.Fatalf("Repair of intact rules = %v, %v", repaired, err)
	}
	if got, want := sortedLines(listing(t, ns)), sortedLines(before); got != want {
		t.Fatalf("the repaired ruleset differs\n%s", lineDiff(want, got))
	}
	taps, err := e.Confined()
	if err != nil || len(taps) != 201 {
		t.Fatalf("Confined() = %d taps, %v; want 201", len(taps), err)
	}
}
