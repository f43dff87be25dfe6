"""E2B's users, unchanged: commands and files act as ``user`` (uid 1000, home /home/user) unless
the call says ``user="root"``; relative paths are under the acting user's home; Stat and list
report owner, group and permissions; a user the sandbox does not have is an error."""

from e2b import CommandExitException, InvalidArgumentException, Sandbox

with Sandbox.create() as sbx:
    who = sbx.commands.run("echo $(id -u) $(id -un) $HOME $USER $(pwd)")
    assert who.stdout.split() == ["1000", "user", "/home/user", "user", "/home/user"], who
    root = sbx.commands.run("echo $(id -u) $HOME $(pwd)", user="root")
    assert root.stdout.split() == ["0", "/root", "/root"], root
    assert sbx.commands.run("sudo -n id -u").stdout == "0\n"  # passwordless sudo
    try:
        sbx.commands.run("touch /root/nope")
        raise AssertionError("user must not write into /root")
    except CommandExitException as denied:
        assert "Permission denied" in denied.stderr, denied

    # Files: written as the user, theirs; relative paths under their home.
    info = sbx.files.write("notes/today.txt", "hello\n")
    assert info.path == "/home/user/notes/today.txt", info
    entry = sbx.files.get_info("notes/today.txt")
    assert (entry.owner, entry.group, entry.permissions) == ("user", "user", "-rw-r--r--"), entry
    assert sbx.commands.run("stat -c %U:%G notes notes/today.txt").stdout.split() == ["user:user"] * 2
    assert sbx.files.read("/home/user/notes/today.txt") == "hello\n"
    listed = {e.name: (e.owner, e.group) for e in sbx.files.list("/home/user/notes")}
    assert listed == {"today.txt": ("user", "user")}, listed
    assert sbx.files.make_dir("made")
    assert sbx.files.get_info("/home/user/made").owner == "user"

    # As root: root's files and root's home.
    sbx.files.write("secret.txt", "root only", user="root")
    assert sbx.files.get_info("/root/secret.txt", user="root").owner == "root"
    sbx.commands.run("chmod 600 /root/secret.txt", user="root")
    assert sbx.files.read("secret.txt", user="root") == "root only"
    try:
        sbx.files.read("/root/secret.txt")
        raise AssertionError("user must not read root's file")
    except InvalidArgumentException as refused:
        assert "Permission denied" in str(refused), refused

    try:
        sbx.commands.run("true", user="nobody-here")
        raise AssertionError("an unknown user must be refused")
    except InvalidArgumentException as unknown:
        assert "unknown user 'nobody-here' in the sandbox" in str(unknown), unknown

print("users ok")
