package zzequiv

import (
	"reflect"
	"strings"
	"testing"

	"github.com/pglease/pglease/internal/store"
)

// Every statement of the store, bound for a few tables, is the text the
// old templating bound, with or without the journal.
func TestSameText(t *testing.T) {
	changed := map[string]bool{"List": true, "Drop": true} // deliberately: the state view (schema version 9)
	for _, name := range []string{"pglease_leases", "jobs", "app.jobs", "Mixed_Case.T1"} {
		old, err := parseTable(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range []bool{true, false} {
			o := old.statementsJournal(j)
			n := store.New(nil, store.NewNames(strings.Split(name, ".")...), j).SQL()
			ov := reflect.ValueOf(o)
			checked := 0
			for i := 0; i < ov.NumField(); i++ {
				f := ov.Type().Field(i).Name
				nf := strings.ToUpper(f[:1]) + f[1:]
				switch f {
				case "fenceAdvance":
					nf = "AdvanceFence"
				case "fenceCurrent":
					nf = "CurrentFence"
				case "pruneClaim":
					nf = "ClaimPruning"
				case "forceRelease":
					if !j {
						continue // the admin's statements always journal
					}
				}
				if changed[nf] {
					continue
				}
				got := reflect.ValueOf(*n).FieldByName(nf).String()
				if got != ov.Field(i).String() {
					t.Errorf("%s journal=%v %s:\nold %s\nnew %s", name, j, f, ov.Field(i).String(), got)
				}
				checked++
			}
			t.Logf("%s journal=%v: %d statements the same", name, j, checked)
			if n.TableExists != tableExistsSQL || n.MigrateLock != migrateLockSQL {
				t.Errorf("tableExists or migrateLock differ")
			}
		}
		if got, want := store.SchemaSQL(store.NewNames(strings.Split(name, ".")...)), old.schemaSQLOld(); !strings.HasPrefix(got, want) {
			t.Errorf("SchemaSQL differs before version 9:\n%s\n----\n%s", got, want)
		}
	}
}

func (t table) schemaSQLOld() string {
	var b strings.Builder
	b.WriteString("-- pglease schema version 9 for " + t.quoted + "\n")
	b.WriteString(strings.TrimSpace(t.bind(versionTableSQL)) + ";\n")
	for v, m := range store.Migrations()[:8] {
		b.WriteString(strings.TrimSuffix(strings.TrimSpace(t.schema(m)), ";") + ";\n")
		b.WriteString("INSERT INTO " + t.version + " (version) VALUES (" + string(rune('1'+v)) + ") ON CONFLICT DO NOTHING;\n")
	}
	return b.String()
}

func TestDropAndNames(t *testing.T) {
	for _, name := range []string{"pglease_leases", "app.jobs"} {
		old, _ := parseTable(name)
		nn := store.NewNames(strings.Split(name, ".")...)
		n := store.New(nil, nn, true).SQL()
		view := old.quoted[:len(old.quoted)-1] + `_state"`
		if n.Drop != "\nDROP VIEW IF EXISTS "+view+";"+old.statements().drop {
			t.Errorf("drop:\n%s\n%s", n.Drop, old.statements().drop)
		}
		if nn.Channel != old.channel || nn.LockClass != old.lockClass || nn.Version != old.version {
			t.Errorf("names differ")
		}
	}
}
