"""``ConversationContext.get_committed_events()`` as Line 0.1 computed it: the agent's generated text
(``AgentResponse``) aligned with what the speech engine reported spoken (``AgentSpeechSent``, words
without the whitespace between them), keeping the generated formatting; and bargein's own exact
history unchanged when no ``AgentSpeechSent`` is in it."""

from __future__ import annotations

import unicodedata

import pytest

from bargein.agent.committed import Alignment, align_spoken
from bargein.line.events import (
    AgentResponse,
    AgentSpeechSent,
    DTMFInputEvent,
    Event,
    ToolCall,
    UserTranscriptionReceived,
)
from bargein.line.nodes.conversation_context import ConversationContext


def committed(*events: Event) -> list[Event]:
    return ConversationContext(events=list(events), system_prompt="").get_committed_events()


def said(text: str) -> AgentResponse:
    return AgentResponse(content=text)


def spoke(text: str) -> AgentSpeechSent:
    return AgentSpeechSent(content=text)


def user(text: str) -> UserTranscriptionReceived:
    return UserTranscriptionReceived(content=text)


# --- whole answers and interrupted ones -----------------------------------------------------------


def test_a_fully_spoken_answer_is_committed_with_its_spaces() -> None:
    assert committed(said("Sure, I can help with that."), spoke("Sure,Icanhelpwiththat.")) == [
        said("Sure, I can help with that.")
    ]


def test_an_answer_cut_off_between_sentences_keeps_the_spoken_sentence() -> None:
    events = committed(said("Your order ships Monday. Anything else today?"), spoke("YourordershipsMonday."))
    assert events == [said("Your order ships Monday.")]


def test_an_answer_cut_off_between_words_keeps_the_words_spoken() -> None:
    assert committed(said("I found three flights to Rome."), spoke("Ifoundthree")) == [said("I found three")]


def test_a_word_cut_off_midway_is_not_committed() -> None:
    """The caller heard only part of "look", so the history stops before it."""
    assert committed(said("Let me look that up for you."), spoke("Letmelo")) == [said("Let me")]


def test_what_was_not_spoken_stays_pending_for_the_next_report() -> None:
    """An engine may report one answer in pieces: the second report continues where the first
    stopped, and the pieces keep their own formatting."""
    events = committed(said("One moment, while I check.\nStill there?"), spoke("Onemoment,"), spoke("whileI"))
    assert events == [said("One moment,"), said("while I")]
    assert align_spoken("Hello world. Bye now.", "Helloworld.") == Alignment("Hello world.", " Bye now.")


def test_a_generated_answer_never_reported_spoken_is_left_out_once_reports_are_in_the_history() -> None:
    events = committed(said("Hello."), spoke("Hello."), user("And?"), said("Let me think about it."))
    assert events == [said("Hello."), user("And?")]


def test_a_report_with_nothing_generated_before_it_commits_what_was_reported() -> None:
    assert committed(spoke("Please hold.")) == [said("Please hold.")]


def test_an_empty_report_commits_nothing() -> None:
    assert committed(said("Hmm, right."), spoke("")) == []


# --- several responses before one report ----------------------------------------------------------


def test_streamed_chunks_are_aligned_as_one_text() -> None:
    chunks = [said("The weather"), said(" in Paris"), said(" is sunny,"), said(" 22 degrees.")]
    assert committed(*chunks, spoke("TheweatherinParisissunny,22degrees.")) == [
        said("The weather in Paris is sunny, 22 degrees.")
    ]


def test_an_interruption_inside_a_later_chunk_cuts_across_the_chunks() -> None:
    chunks = [said("First, "), said("preheat the oven. "), said("Then mix the flour and sugar.")]
    assert committed(*chunks, spoke("First,preheattheoven.Thenmix")) == [
        said("First, preheat the oven. Then mix")
    ]


def test_chunks_joined_without_a_space_stay_joined() -> None:
    assert committed(said("Yes."), said("No."), spoke("Yes.No.")) == [said("Yes.No.")]


# --- whitespace and punctuation -------------------------------------------------------------------


def test_newlines_tabs_and_runs_of_spaces_inside_the_spoken_part_are_kept() -> None:
    text = "Step one:\n\n\tOpen the app.   Step two:\n\tSign in."
    assert committed(said(text), spoke("Stepone:Opentheapp.Steptwo:")) == [
        said("Step one:\n\n\tOpen the app.   Step two:")
    ]


def test_leading_and_trailing_whitespace_is_stripped() -> None:
    assert committed(said("\n  Good morning!  \n"), spoke("Goodmorning!")) == [said("Good morning!")]


def test_whitespace_in_the_report_is_ignored() -> None:
    """Engines leave whitespace out; a report that keeps some, even where the generated text has
    none, aligns the same."""
    assert committed(said("Hi there.How are you?"), spoke(" Hi there. How")) == [said("Hi there.How")]


def test_punctuation_the_engine_did_not_report_is_left_out() -> None:
    events = committed(said("Hello, world! How are you?"), spoke("Helloworld"), spoke("Howareyou?"))
    assert events == [said("Hello world"), said("How are you?")]


def test_symbols_quotes_and_urls_align_character_for_character() -> None:
    text = 'Type "yes" (or Y) at https://example.org/help?id=7 - it\'s 100% safe.'
    speech = "".join(text.split())
    assert committed(said(text), spoke(speech)) == [said(text)]
    assert committed(said(text), spoke('Type"yes"(orY)')) == [said('Type "yes" (or Y)')]


# --- scripts --------------------------------------------------------------------------------------


def test_chinese_without_spaces_commits_the_report() -> None:
    assert committed(said("我们明天上午十点见。"), spoke("我们明天上午十点见。")) == [
        said("我们明天上午十点见。")
    ]
    assert committed(said("我们明天上午十点见。"), spoke("我们明天")) == [said("我们明天")]


def test_japanese_with_spaces_commits_whole_tokens_only() -> None:
    text = "はい、 わかりました。 少々お待ちください。"
    assert committed(said(text), spoke("はい、わかりました。少々")) == [said("はい、 わかりました。")]


def test_korean_interrupted_after_the_first_sentence() -> None:
    assert committed(said("네, 알겠습니다. 잠시만 기다려 주세요."), spoke("네,알겠습니다.")) == [
        said("네, 알겠습니다.")
    ]


def test_a_cjk_answer_after_an_interrupted_one_starts_afresh() -> None:
    events = committed(
        said("这是第一个回答"), spoke("这是"), user("停"), said("好的我停下来。"), spoke("好的我停下来。")
    )
    assert events == [said("这是"), user("停"), said("好的我停下来。")]


# --- emoji ----------------------------------------------------------------------------------------


def test_emoji_full_and_interrupted() -> None:
    text = "Done ✅ see you soon 👋🏿"
    assert committed(said(text), spoke("Done✅seeyousoon👋🏿")) == [said(text)]
    assert committed(said(text), spoke("Done✅seeyou")) == [said("Done ✅ see you")]


def test_emoji_sequences_with_joiners_and_variation_selectors_are_single_tokens() -> None:
    text = "I ❤️ this family 👨\u200d👩\u200d👧 photo!"
    assert committed(said(text), spoke("I❤️thisfamily👨\u200d👩\u200d👧")) == [
        said("I ❤️ this family 👨\u200d👩\u200d👧")
    ]


# --- diacritics -----------------------------------------------------------------------------------


def test_accented_latin_text() -> None:
    text = "Přejete si kávu, nebo čaj? Děkuji."
    assert committed(said(text), spoke("Přejetesikávu,nebočaj?Děkuji.")) == [said(text)]
    assert committed(said(text), spoke("Přejetesikávu")) == [said("Přejete si kávu")]


def test_decomposed_accents_belong_to_their_letters() -> None:
    text = unicodedata.normalize("NFD", "Le café est fermé aujourd'hui.")
    speech = unicodedata.normalize("NFD", "Lecaféestfermé")
    assert committed(said(text), spoke(speech)) == [said(unicodedata.normalize("NFD", "Le café est fermé"))]


def test_a_devanagari_word_cut_off_midway_is_not_committed() -> None:
    """Vowel signs are combining marks: they belong to their word, so half a word is not committed."""
    text = "नमस्ते, आज मौसम अच्छा है।"
    assert committed(said(text), spoke("नमस्ते,आजमौसमअच्छाहै।")) == [said(text)]
    assert committed(said(text), spoke("नमस्ते,आजमौ")) == [said("नमस्ते, आज")]


# --- a conversation -------------------------------------------------------------------------------


def test_turns_interleaved_with_user_transcripts_and_other_events() -> None:
    """An interrupted greeting's unspoken rest is skipped by the next answer's report; other events
    pass through unchanged and in place."""
    lookup = ToolCall(tool_name="search_flights", tool_args={"to": "LIS"}, tool_call_id="c1")
    events = committed(
        said("Hi! I'm Ava, your travel assistant. Where would you like to go?"),
        spoke("Hi!I'mAva,yourtravel"),
        user("Lisbon, please."),
        said("Lisbon is lovely in spring. Shall I look for flights?"),
        spoke("Lisbonislovelyinspring.ShallIlookforflights?"),
        user("Yes."),
        DTMFInputEvent(button="1"),
        lookup,
        said("Great, searching now."),
        spoke("Great,searchingnow."),
        user("Thanks"),
    )
    assert events == [
        said("Hi! I'm Ava, your travel"),
        user("Lisbon, please."),
        said("Lisbon is lovely in spring. Shall I look for flights?"),
        user("Yes."),
        DTMFInputEvent(button="1"),
        lookup,
        said("Great, searching now."),
        user("Thanks"),
    ]


def test_the_context_itself_is_left_as_it_was() -> None:
    events: list[Event] = [said("Hello there, friend."), spoke("Hellothere")]
    context = ConversationContext(events=events, system_prompt="")
    assert context.get_committed_events() == [said("Hello there")]
    assert context.events == [said("Hello there, friend."), spoke("Hellothere")]


# --- bargein's own history: no AgentSpeechSent ----------------------------------------------------


@pytest.mark.parametrize(
    "history, expected",
    [
        ([], []),
        ([user("Hi"), user("Anyone?")], [user("Hi"), user("Anyone?")]),
        (
            [user("What time is it?"), said("It's noon."), user("Thanks"), said(""), user("Bye")],
            [user("What time is it?"), said("It's noon."), user("Thanks"), user("Bye")],
        ),
    ],
)
def test_without_speech_reports_the_exact_history_is_kept(
    history: list[Event], expected: list[Event]
) -> None:
    """bargein cuts an interrupted answer to what was delivered before it reaches the history, so
    with no ``AgentSpeechSent`` every answer is already committed; only empty ones are dropped."""
    assert committed(*history) == expected
