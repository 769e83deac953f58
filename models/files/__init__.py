"""Files every stage reads or writes: atomic writes, SHA-256 digests, image extensions, the one folder walk and the run
folder layout. Standard library only, so command lines use them freely.
"""
