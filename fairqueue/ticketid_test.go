package fairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTicketIDRoundTripsAndNamesItsNodeAndFlow(t *testing.T) {
	for _, id := range []TicketID{
		{Node: "9f3a", Counter: 1},
		{Node: "9f3a", Counter: 36, Flow: "0123456789abcdef.2"},
	} {
		s := id.String()
		got, err := ParseTicketID(s)
		require.NoError(t, err)
		assert.Equal(t, id, got)
		assert.Equal(t, id.Node, TicketNode(s))
		assert.Equal(t, id.Flow, TicketFlow(s))
	}
	assert.Equal(t, "9f3a:10", TicketID{Node: "9f3a", Counter: 36}.String())
	for _, bad := range []string{"", "node", ":1", "node:", "node:!"} {
		_, err := ParseTicketID(bad)
		assert.Error(t, err, bad)
	}
}
