package network

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/testenv"
)

// sysctlIn sets a sysctl in network namespace ns.
func sysctlIn(t *testing.T, ns, key, value string) {
	t.Helper()
	run(t, "ip", "netns", "exec", ns, "sysctl", "-qw", key+"="+value)
}

// sendUDP6 sends payload from ns to the all-nodes multicast group on dev.
func sendUDP6(ns, dev, payload string) error {
	return inNetNS(ns, func() error {
		c, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: net.IPv6linklocalallnodes, Port: 9, Zone: dev})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
}

// framesUntil reads frames until one holds marker and returns those that
// came before it.
func framesUntil(t *testing.T, frames <-chan []byte, marker string) [][]byte {
	t.Helper()
	var before [][]byte
	timeout := time.After(waitTimeout)
	for {
		select {
		case frame, ok := <-frames:
			if !ok {
				t.Fatal("sniffer closed")
			}
			if bytes.Contains(frame, []byte(marker)) {
				return before
			}
			before = append(before, frame)
		case <-timeout:
			t.Fatalf("marker %q never arrived", marker)
		}
	}
}

// The host sends a guest nothing but IPv4 and ARP, even with IPv6 turned
// on again on the bridge and the tap (as if someone reset the sysctls
// Links sets): neither what goes through the bridge nor what the node
// sends out of the tap itself (router solicitations, MLD, DAD) arrives.
func TestBaselineSendsGuestsNoIPv6(t *testing.T) {
	n := newTestNet(t, "node-1")
	g := n.guest(t, n.baseline, "node-1", "team-a", "one", "10.88.1.2")
	// A port of the bridge without a baseline, for the positive control:
	// what the host sends there arrives. Its far end sends no IPv6 of its
	// own, which the bridge would forward to the guest.
	ctl := testNetNS(t)
	run(t, "ip", "-n", n.host, "link", "add", "ctl0", "type", "veth", "peer", "name", "eth0", "netns", ctl)
	sysctlIn(t, ctl, "net.ipv6.conf.eth0.disable_ipv6", "1")
	run(t, "ip", "-n", ctl, "link", "set", "eth0", "up")
	run(t, "ip", "-n", n.host, "link", "set", "ctl0", "master", n.bridge, "up")
	for _, dev := range []string{n.bridge, g.Tap, "ctl0"} {
		sysctlIn(t, n.host, "net.ipv6.conf."+dev+".accept_dad", "0")
		sysctlIn(t, n.host, "net.ipv6.conf."+dev+".disable_ipv6", "0")
	}
	for _, dev := range []string{n.bridge, g.Tap, "ctl0"} {
		testenv.Eventually(t, waitTimeout, "a link-local IPv6 address on "+dev, func() (bool, string) {
			out, _ := exec.Command("ip", "-n", n.host, "-6", "addr", "show", "dev", dev, "scope", "link").CombinedOutput()
			return strings.Contains(string(out), "fe80::") && !strings.Contains(string(out), "tentative"), string(out)
		})
	}
	atGuest := sniff(t, g.netns)
	atControl := sniff(t, ctl)

	for round := range 2 {
		sent := map[string]string{
			n.bridge: fmt.Sprint("v6-bridge-", round),
			g.Tap:    fmt.Sprint("v6-tap-", round),
			"ctl0":   fmt.Sprint("v6-port-", round),
		}
		for dev, payload := range sent {
			err := sendUDP6(n.host, dev, payload)
			if dev == g.Tap && errors.Is(err, unix.EPERM) {
				continue // refused by the baseline's output chain, as it should be
			}
			if err != nil {
				t.Fatalf("sending IPv6 on %s: %v", dev, err)
			}
		}
		// The gateway's IPv4 to the guest, sent after: what came before
		// it and was let through has arrived when it does.
		marker := fmt.Sprint("marker-v4-", round)
		if err := sendUDP(n.host, n.gateway.String(), "10.88.1.2:7001", marker); err != nil {
			t.Fatal(err)
		}
		for _, frame := range framesUntil(t, atGuest, marker) {
			if len(frame) < 14 {
				continue
			}
			if etherType := binary.BigEndian.Uint16(frame[12:14]); etherType != 0x0800 && etherType != 0x0806 {
				t.Errorf("the guest received EtherType %#04x from the host: % x", etherType, frame)
			}
		}
		// The control port got the host's IPv6, through the bridge and
		// sent on the port itself.
		awaited := map[string]bool{sent[n.bridge]: true, sent["ctl0"]: true}
		timeout := time.After(waitTimeout)
		for len(awaited) > 0 {
			select {
			case frame := <-atControl:
				for payload := range awaited {
					if bytes.Contains(frame, []byte(payload)) {
						delete(awaited, payload)
					}
				}
			case <-timeout:
				t.Fatalf("the control port never got %v", awaited)
			}
		}
	}
}
