using Tern.Proxy.Configuration;

namespace Tern.Tests.Configuration;

public sealed class FilePollTests
{
    [Fact]
    public async Task Since_ChangeMadeAfterTheEarlierPollBegan_IsSeen()
    {
        // A reload reads the files between two polls: what changed after the first began must
        // fire the second, even though the second begins after the change.
        var path = Path.Combine(Directory.CreateTempSubdirectory("tern-poll-").FullName, "tls.crt");
        await File.WriteAllTextAsync(path, "before");
        using var first = new FilePoll([path]);
        await File.WriteAllTextAsync(path, "after");
        using var since = new FilePoll([path], since: first);
        using var fresh = new FilePoll([path]);

        for (var i = 0; i < 50 && !since.Token.HasChanged; i++)
        {
            await Task.Delay(100);
        }

        Assert.True(since.Token.HasChanged);
        Assert.True(first.Token.HasChanged);
        Assert.False(fresh.Token.HasChanged);
    }
}
