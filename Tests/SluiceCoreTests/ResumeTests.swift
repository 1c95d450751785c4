import SluiceCore
import Testing

/// `Resume` and `DownloadResumption`: which validators allow a resume (RFC 9110 §13.1.5,
/// §8.8.2.2), `Content-Range` parsing, the limit and backoff, and which continuations carry
/// the body on — never one of another representation or range.
@Suite struct ResumeTests {
    @Test func strongValidatorsOnly() {
        #expect(Resume.validator(etag: "\"abc\"", lastModified: nil, date: nil) == "\"abc\"")
        #expect(Resume.validator(etag: " \"abc\" ", lastModified: nil, date: nil) == "\"abc\"")
        #expect(Resume.validator(etag: "W/\"abc\"", lastModified: nil, date: nil) == nil)
        // A weak tag rules the date out too: the client "has an entity tag".
        #expect(
            Resume.validator(
                etag: "W/\"abc\"", lastModified: "Mon, 23 Nov 2026 10:00:00 GMT", date: "Tue, 24 Nov 2026 10:00:00 GMT")
                == nil)
        #expect(
            Resume.validator(etag: nil, lastModified: "Mon, 23 Nov 2026 10:00:00 GMT", date: "Mon, 23 Nov 2026 10:00:01 GMT")
                == "Mon, 23 Nov 2026 10:00:00 GMT")
        // Modified within the second of the Date: not strong; no Date: not strong.
        #expect(
            Resume.validator(etag: nil, lastModified: "Mon, 23 Nov 2026 10:00:00 GMT", date: "Mon, 23 Nov 2026 10:00:00 GMT")
                == nil)
        #expect(Resume.validator(etag: nil, lastModified: "Mon, 23 Nov 2026 10:00:00 GMT", date: nil) == nil)
        #expect(Resume.validator(etag: nil, lastModified: "yesterday", date: "Mon, 23 Nov 2026 10:00:00 GMT") == nil)
        #expect(Resume.validator(etag: "\"", lastModified: nil, date: nil) == nil)
        #expect(Resume.validator(etag: nil, lastModified: nil, date: nil) == nil)
    }

    @Test func contentRanges() {
        #expect(Resume.parseContentRange("bytes 100-199/200")! == (100, 199, 200))
        #expect(Resume.parseContentRange("bytes 100-199/*")! == (100, 199, nil))
        #expect(Resume.parseContentRange("bytes 100-200/200") == nil)  // past the end
        #expect(Resume.parseContentRange("bytes 200-100/300") == nil)
        #expect(Resume.parseContentRange("bytes */200") == nil)
        #expect(Resume.parseContentRange("items 1-2/3") == nil)
        #expect(Resume.parseContentRange("bytes -1-2/3") == nil)
        #expect(Resume.parseContentRange("bytes 1-2/x") == nil)
    }

    @Test func threeResumesWithTheDefaultBackoffThenGiveUp() {
        var r = DownloadResumption(validator: "\"v1\"", total: 1000, retry: nil)
        #expect(
            r.broke(at: 100) == .resume(delay: 500, fields: [("Range", "bytes=100-"), ("If-Range", "\"v1\"")]))
        #expect(
            r.answered(status: 206, contentRange: "bytes 100-999/1000", contentLength: "900", etag: "\"v1\"", lastModified: nil)
                == nil)
        #expect(r.broke(at: 400) == .resume(delay: 1000, fields: [("Range", "bytes=400-"), ("If-Range", "\"v1\"")]))
        #expect(
            r.answered(status: 206, contentRange: "bytes 400-999/1000", contentLength: "600", etag: nil, lastModified: nil) == nil
        )
        #expect(r.broke(at: 700) == .resume(delay: 2000, fields: [("Range", "bytes=700-"), ("If-Range", "\"v1\"")]))
        #expect(r.broke(at: 700) == .giveUp("resume limit (3) reached"))
        #expect(r.offsets == [100, 400, 700] && r.acceptedOffsets == [100, 400])
    }

    @Test func thePolicysRetryLimitAndBackoff() {
        var r = DownloadResumption(validator: "\"v\"", total: nil, retry: RetryPolicy(limit: 1, scale: 50))
        #expect(r.limit == 1)
        guard case .resume(let delay, _) = r.broke(at: 5) else {
            Issue.record("no resume")
            return
        }
        #expect(delay == 50)
        #expect(r.broke(at: 9) == .giveUp("resume limit (1) reached"))
        var zero = DownloadResumption(validator: "\"v\"", total: nil, retry: RetryPolicy(limit: 0))
        #expect(zero.broke(at: 5) == .giveUp("resume limit (0) reached"))
    }

    @Test func onlyTheRestOfTheSameRepresentationContinues() {
        func asked(total: Int64? = 1000, validator: String = "\"v1\"") -> DownloadResumption {
            var r = DownloadResumption(validator: validator, total: total, retry: nil)
            _ = r.broke(at: 300)
            return r
        }
        var r = asked()
        #expect(
            r.answered(status: 200, contentRange: nil, contentLength: nil, etag: "\"v2\"", lastModified: nil)?.contains("200")
                == true)
        r = asked()
        #expect(
            r.answered(status: 206, contentRange: "bytes 0-999/1000", contentLength: "1000", etag: "\"v1\"", lastModified: nil)
                != nil)
        r = asked()
        #expect(
            r.answered(status: 206, contentRange: "bytes 300-899/1000", contentLength: "600", etag: "\"v1\"", lastModified: nil)
                != nil)
        r = asked()
        #expect(
            r.answered(status: 206, contentRange: "bytes 300-1199/1200", contentLength: "900", etag: "\"v1\"", lastModified: nil)
                != nil)
        r = asked()
        #expect(
            r.answered(status: 206, contentRange: "bytes 300-999/1000", contentLength: "700", etag: "\"v2\"", lastModified: nil)
                != nil)
        r = asked()
        #expect(r.answered(status: 206, contentRange: nil, contentLength: nil, etag: "\"v1\"", lastModified: nil) != nil)
        r = asked()
        #expect(r.answered(status: 412, contentRange: nil, contentLength: nil, etag: nil, lastModified: nil) != nil)
        #expect(r.acceptedOffsets.isEmpty)
        // Unknown total (a chunked first response): the rest to its end, whatever its length.
        r = asked(total: nil)
        #expect(
            r.answered(status: 206, contentRange: "bytes 300-4999/5000", contentLength: "4700", etag: nil, lastModified: nil)
                == nil)
        r = asked(total: nil)
        #expect(
            r.answered(status: 206, contentRange: "bytes 300-399/5000", contentLength: "100", etag: nil, lastModified: nil) != nil
        )
        // A date validator: the 206's Last-Modified must be the same when it has one.
        let date = "Mon, 23 Nov 2026 10:00:00 GMT"
        r = asked(validator: date)
        #expect(
            r.answered(status: 206, contentRange: "bytes 300-999/1000", contentLength: "700", etag: nil, lastModified: date)
                == nil)
        r = asked(validator: date)
        #expect(
            r.answered(
                status: 206, contentRange: "bytes 300-999/1000", contentLength: "700", etag: nil,
                lastModified: "Tue, 24 Nov 2026 10:00:00 GMT")
                != nil)
    }

    @Test func theRangesLengthMustBeAnnounced() {
        var r = DownloadResumption(validator: "\"v1\"", total: 1000, retry: nil)
        _ = r.broke(at: 300)
        #expect(
            r.answered(status: 206, contentRange: "bytes 300-999/1000", contentLength: nil, etag: nil, lastModified: nil)
                == "the resume's 206 does not announce the range's length")
        #expect(
            r.answered(status: 206, contentRange: "bytes 300-999/1000", contentLength: "5000", etag: nil, lastModified: nil)
                != nil)
        #expect(
            r.answered(status: 206, contentRange: "bytes 300-999/1000", contentLength: "700", etag: nil, lastModified: nil)
                == nil)
    }

    @Test func aBodyThatWasCompleteIsNotAskedFor() {
        var r = DownloadResumption(validator: "\"v\"", total: 10, retry: nil)
        #expect(r.broke(at: 10) == .giveUp("the body was complete"))
    }
}
