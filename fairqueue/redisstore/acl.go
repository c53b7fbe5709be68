package redisstore

import "cmp"

// ACLRules is the ACL a Redis user needs to hold the queues of key
// prefix ("": DefaultKeyPrefix), as the rules of ACL SETUSER: the queues'
// keys and the registry's, the queues' channels, and the commands of
// +@all -@dangerous (the scripts, pub/sub, the reads and writes). A user
// without one of them is answered NOPERM.
func ACLRules(prefix string) string {
	p := braces.Replace(cmp.Or(prefix, DefaultKeyPrefix))
	return "resetkeys resetchannels ~{" + p + ":* ~{" + p + "}:* &{" + p + ":* +@all -@dangerous"
}

// PermissionsNeeded is ACLRules of the store's key prefix
// (fairqueue.PermissionNeeder).
func (s *Store) PermissionsNeeded() string { return ACLRules(s.prefix) }
