"""Files every stage reads or writes; standard library only."""
