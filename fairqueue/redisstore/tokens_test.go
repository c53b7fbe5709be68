package redisstore

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The scripts' constants are the Go ones: the bound on passes in fair
// order (fairqueue.TokenPasses) and on idle counters kept
// (fairqueue.IdleFlows).
func TestScriptConstantsAreTheGoConstants(t *testing.T) {
	for file, want := range map[string]string{
		"tokens.lua": fmt.Sprintf("local TOKEN_PASSES, TOKEN_SCAN = %d,", fairqueue.TokenPasses),
		"fair.lua":   fmt.Sprintf("local IDLE_FLOWS = %d\n", fairqueue.IdleFlows),
	} {
		src, err := luaFS.ReadFile("lua/" + file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(src), want) {
			t.Fatalf("%s does not say %q", file, want)
		}
	}
}

// The scripts' forms of a ticket's weight and of a pool with tokens.
func TestArgsCarryTokensOnlyWhereCounted(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{costArg(fairqueue.TicketArgs{Cost: 1.5}), "1.5"},
		{costArg(fairqueue.TicketArgs{Cost: 2, Tokens: 300}), "2 300"},
		{poolArg([]fairqueue.Upstream{{Dial: "a:1", Permits: 2}, {Dial: "b:1", Permits: 3, KVTokens: 900}}), "a:1 2 b:1 3/900"},
		{fmt.Sprint((&Store{}).args("t", fairqueue.Limits{Permits: 4, Tokens: -1, TokenBound: 900})[1]), "4 -1 900"},
		{fmt.Sprint((&Store{}).args("t", fairqueue.Limits{Permits: 4, Learned: true})[1]), "4 0 0 a"},
		{fmt.Sprint((&Store{}).args("t", fairqueue.Limits{Permits: 4})[1]), "4"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
