raise ImportError("this module cannot be imported")
